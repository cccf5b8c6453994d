"""Topic requirements stated once per Kafka connector (``topic_spec``), used by the connectors at
start; the Kafka ledger on one broker with allow_weak_durability."""

from __future__ import annotations

import logging

import pytest

from connectors.kafka import KafkaConnectorError, KafkaDeadLetterSink, KafkaLedger, KafkaModelSink, KafkaSource
from connectors.kafka.topics import BROKER_DEFAULT, TopicSpec, spec_of
from kafka_broker import unique_topic


def _describe(bootstrap, topic):
    """(partitions, replicas of partition 0, {config: value}) of ``topic``."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (t,) = admin.describe_topics([topic])
        res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    finally:
        admin.close()
    configs = {k: v.get("value") for k, v in res.get("topic", {}).get(topic, {}).items()}
    return len(t["partitions"]), len(t["partitions"][0]["replica_nodes"]), configs


class _Checked(Exception):
    """Raised by the recording ensure: the constructor stops before any client is made."""


@pytest.mark.parametrize("cls, options", [
    (KafkaModelSink, {"topic": "m", "partitions": 3, "max_message_bytes": 2_000_000}),
    (KafkaModelSink, {"topic": "m"}),
    (KafkaDeadLetterSink, {"topic": "d", "replication_factor": 2}),
    (KafkaLedger, {"topic": "l", "name": "n", "replication_factor": 5, "min_insync_replicas": 3}),
])
def test_a_connector_checks_its_topic_with_the_spec_the_topics_command_derives(monkeypatch, cls, options):
    """The one place: what the constructor hands to ensure_topic is what spec_of (the command's
    view of the same configuration options) gives."""
    seen = []

    def record(spec, servers, security, create=True):
        seen.append(spec)
        raise _Checked

    monkeypatch.setattr(TopicSpec, "ensure", record)
    options = {"bootstrap_servers": "127.0.0.1:1", **options}
    with pytest.raises(_Checked):
        cls(**options)
    assert seen == spec_of(cls, options)


def test_specs_state_what_each_connector_requires():
    (model,) = spec_of(KafkaModelSink, {"bootstrap_servers": "x:1"})
    assert model.configs == {"cleanup.policy": "compact", "max.message.bytes": "1048576"}  # the sink's default
    (ledger,) = spec_of(KafkaLedger, {"bootstrap_servers": "x:1", "name": "n"})
    assert (ledger.replication_factor, ledger.min_replication, ledger.fits_cluster) == (3, 3, False)
    assert ledger.configs == {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    inputs = spec_of(KafkaSource, {"bootstrap_servers": "x:1", "topics": ["a", "b"]}, partitions=4)
    assert [(s.topic, s.partitions, s.replication_factor, dict(s.configs)) for s in inputs] == [
        ("a", 4, BROKER_DEFAULT, {}), ("b", 4, BROKER_DEFAULT, {})]


def test_within_a_cluster_caps_replicas_and_what_depends_on_them():
    spec = KafkaLedger.topic_spec("l", 3, 2, allow_weak_durability=True)
    one = spec.within(1)
    assert (one.replication_factor, one.configs["min.insync.replicas"], one.min_replication) == (1, "1", 1)
    assert one.durability(spec) == "replication 1 (instead of 3), min.insync.replicas 1 (instead of 2)"
    assert spec.within(5) == spec  # a cluster that holds it changes nothing
    assert KafkaSource.topic_specs("t", 1)[0].within(1).replication_factor == 1


# --- the Kafka ledger on one broker ---------------------------------------------------------------

@pytest.mark.kafka
def test_weak_durability_creates_the_ledger_topic_with_what_one_broker_holds_and_warns(kafka_bootstrap, caplog):
    topic = unique_topic("ledger")
    with caplog.at_level(logging.WARNING, logger="connectors.kafka"):
        ledger = KafkaLedger(kafka_bootstrap, topic, name="w", allow_weak_durability=True)  # 3 / 2 configured
    ledger.close()
    _, replicas, configs = _describe(kafka_bootstrap, topic)
    assert (replicas, configs["min.insync.replicas"], configs["cleanup.policy"]) == (1, "1", "compact")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and topic in r.getMessage()]
    assert "replication 1 (instead of 3), min.insync.replicas 1 (instead of 2) on 1 broker(s)" in warning
    assert "a lost broker disk loses the record of the spent budget" in warning


@pytest.mark.kafka
def test_without_weak_durability_the_ledger_error_names_the_keys_that_fix_it(kafka_bootstrap):
    with pytest.raises(KafkaConnectorError) as caught:
        KafkaLedger(kafka_bootstrap, unique_topic("ledger"), name="w")
    message = str(caught.value)
    assert "InvalidReplicationFactorError (the cluster has fewer than 3 brokers)" in message
    for fix in ("allow_weak_durability: true", "replication_factor and min_insync_replicas",
                "stream-vips topics create --config FILE --single-broker"):
        assert fix in message

