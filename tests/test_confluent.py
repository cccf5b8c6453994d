"""The confluent-kafka client option: configuration mapping, log safety, selection in a config file.

The connectors' behaviour on the real broker (commits, rebalances, static membership,
transactions, dead letters, the duplicate guard) is tested for both clients by the parametrized
tests in test_kafka_connectors.py, test_chaos.py, test_kafka_pipeline.py and
test_static_membership.py; this file covers what only the confluent client has.
"""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("confluent_kafka")

from connectors.kafka import KafkaConnection, KafkaConnectorError, KafkaSource  # noqa: E402
from connectors.kafka.confluent import (  # noqa: E402
    CONSUMER_NAMES,
    LIBRDKAFKA_LOGGER,
    PRODUCER_NAMES,
    librdkafka_config,
)
from kafka_broker import create_topic, unique_topic  # noqa: E402
from stream_vips import logsafety  # noqa: E402
from test_log_safety import CANARY_TEXT, N_GOOD, _config, _found, _outputs, debug_logging  # noqa: E402,F401


def test_security_settings_map_to_librdkafka_names():
    conn = KafkaConnection("a:1, b:2", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                           sasl_username="u", sasl_password="p", ssl_cafile="/ca", ssl_certfile="/cert",
                           ssl_keyfile="/key", reconnect_backoff_max_ms=700, client="confluent")
    conf = librdkafka_config(conn, "stream-vips-source", {"group_id": "g", "isolation_level": "read_committed",
                                                          "group_instance_id": "pod-0"}, CONSUMER_NAMES)
    assert conf == {
        "bootstrap.servers": "a:1,b:2", "client.id": "stream-vips-source", "reconnect.backoff.max.ms": 700,
        "logger": LIBRDKAFKA_LOGGER, "log_level": 6, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "p", "ssl.ca.location": "/ca",
        "ssl.certificate.location": "/cert", "ssl.key.location": "/key", "group.id": "g",
        "isolation.level": "read_committed", "group.instance.id": "pod-0"}
    produced = librdkafka_config(KafkaConnection("a:1"), "x", {"compression_type": None, "acks": "all"},
                                 PRODUCER_NAMES)
    assert produced["compression.type"] == "none" and produced["security.protocol"] == "PLAINTEXT"


def test_an_unknown_client_is_one_clear_error():
    with pytest.raises(KafkaConnectorError, match="client must be kafka-python or confluent, got 'rdkafka'"):
        KafkaSource("localhost:9", "t", client="rdkafka")


def test_the_client_is_chosen_in_the_connector_options_of_a_config_file():
    from stream_vips.config import ConfigError
    from stream_vips.service.build import config_from_dict

    section = {"type": "kafka", "bootstrap_servers": "localhost:9", "topics": "t", "client": "confluent"}
    cfg = config_from_dict({"model": {"family": "linreg", "params": {"dim": 2}}, "source": section}, env={})
    assert cfg.source.options["client"] == "confluent"
    with pytest.raises(ConfigError, match=r"source.client: must be one of \['kafka-python', 'confluent'\]"):
        config_from_dict({"model": {"family": "linreg", "params": {"dim": 2}},
                          "source": {**section, "client": "rdkafka"}}, env={})


def test_librdkafka_logs_reach_only_the_guarded_client_logger(debug_logging, monkeypatch):  # noqa: F811 (the fixture)
    """librdkafka's lines (here: a refused connection) arrive on ``kafka.librdkafka``, which the
    log-safety guard floors (INFO here: the root is at DEBUG) and filters like kafka-python's loggers."""
    from confluent_kafka import Consumer

    monkeypatch.delenv(logsafety.UNSAFE_ENV, raising=False)
    assert logsafety.guard_client_logging() is True
    assert any(isinstance(f, logsafety.ClientPayloadFilter) for f in LIBRDKAFKA_LOGGER.filters)
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = librdkafka_config(KafkaConnection(f"127.0.0.1:{port}"), "log-test", {"group_id": "g"}, CONSUMER_NAMES)
    consumer = Consumer(conf)
    try:
        for _ in range(20):
            consumer.poll(0.1)
            if any(name == LIBRDKAFKA_LOGGER.name for name, _ in debug_logging.lines):
                break
    finally:
        consumer.close()
    lines = [line for name, line in debug_logging.lines if name == LIBRDKAFKA_LOGGER.name]
    assert lines and not any(line.startswith("DEBUG") for line in lines)
    LIBRDKAFKA_LOGGER.debug("Recv: %r", CANARY_TEXT.encode())  # what a payload dump would look like
    assert not any(_found(line) for _, line in debug_logging.lines)


@pytest.mark.kafka
def test_guarded_debug_run_on_the_confluent_client_leaks_no_canary(kafka_bootstrap, tmp_path,
                                                                   debug_logging,  # noqa: F811 (the fixture)
                                                                   monkeypatch):
    """The canary pipeline of test_log_safety.py with every connector on confluent-kafka."""
    from stream_vips.service.app import Application
    from stream_vips.service.build import config_from_dict

    monkeypatch.delenv(logsafety.UNSAFE_ENV, raising=False)
    cfg = _config(kafka_bootstrap, tmp_path)
    for section in ("source", "sink", "dead_letter"):
        cfg[section]["client"] = "confluent"
    debug_logging.lines.clear()
    app = Application.from_config(config_from_dict(cfg, env={}))
    stats = app.run()
    assert stats.records == N_GOOD + 2 and stats.accepted == N_GOOD + 1 and stats.updates >= 1
    assert not any(line.startswith("DEBUG") for name, line in debug_logging.lines if name.startswith("kafka"))
    models, ledger, letters = _outputs(kafka_bootstrap, cfg)
    assert CANARY_TEXT.encode() in letters and models and ledger
    assert _found("\n".join(line for _, line in debug_logging.lines)) == []
    assert _found(models) == [] and _found(ledger) == []


@pytest.mark.kafka
def test_a_checkpoint_seek_applies_once_at_the_first_assignment(kafka_bootstrap):
    """The checkpoint's offsets go into the assignment itself (librdkafka cannot seek a partition
    before it is fetched); a later assignment resumes from the commit, not the checkpoint."""
    from kafka_broker import produce

    topic = create_topic(kafka_bootstrap, unique_topic("cf-seek"))
    produce(kafka_bootstrap, topic, [b"%d" % i for i in range(30)])
    src = KafkaSource(kafka_bootstrap, topic, group_id=unique_topic("g"), client="confluent", until_end=True)
    try:
        src.seek({(topic, 0): 20})
        got = []
        while not src.exhausted:
            got.extend(int(r.value) for r in src.poll(100, 0.5))
        assert got == list(range(20, 30)) and src.positions() == {(topic, 0): 30}
        assert src._seek == {}
    finally:
        src.close()


def test_lost_partitions_are_not_committed(caplog):
    """After an eviction the partitions already have new owners: the callback commits nothing
    and forgets them (the same rule as kafka-python's listener, test_kafka_connectors.py)."""
    from confluent_kafka import TopicPartition

    from connectors.kafka.confluent import ConfluentConsumer

    class Evicted:
        halted = False

        def revoking(self, revoked):
            raise AssertionError("a lost partition must not be committed")

    consumer = ConfluentConsumer(KafkaConnection("127.0.0.1:9"), "lost-test", {"group_id": "g"})
    try:
        consumer.hooks, consumer._assigned = Evicted(), {("t", 3), ("t", 4)}
        with caplog.at_level("WARNING", logger="connectors.kafka"):
            consumer._on_lost(consumer.raw, [TopicPartition("t", 3)])
        assert "partitions lost" in caplog.text and "t/3" in caplog.text
        assert consumer.assignment() == {("t", 4)}
    finally:
        consumer.raw.close()


@pytest.mark.parametrize("code", ["GROUP_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED"])
def test_a_refused_group_or_topic_stops_the_consumer_instead_of_a_warning_for_ever(code):
    """librdkafka reports a group or topic the user may not read as a non-fatal error event and
    retries it for ever: the source raises it (the CLI names the grant, exit 7); other non-fatal
    events (end of partition, a broker away) are only logged."""
    from confluent_kafka import KafkaError, KafkaException, Message

    from connectors.kafka.confluent import ConfluentConsumer

    denied = Message(error=KafkaError(getattr(KafkaError, code)))
    record = Message(topic="t", partition=0, offset=3, value=b"{}")
    with pytest.raises(KafkaException) as info:
        ConfluentConsumer._without_errors([record, denied])
    assert info.value.args[0].code() == getattr(KafkaError, code)
    transient = Message(error=KafkaError(KafkaError._TRANSPORT))
    assert ConfluentConsumer._without_errors([record, transient]) == [record]
