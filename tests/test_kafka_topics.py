"""Topic requirements stated once per Kafka connector (``topic_spec``), used by the connectors at
start and by ``stream-vips topics``; the Kafka ledger on one broker with allow_weak_durability."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

import stream_vips.cli as cli
from connectors.kafka import KafkaConnectorError, KafkaDeadLetterSink, KafkaLedger, KafkaModelSink, KafkaSource
from connectors.kafka.topics import BROKER_DEFAULT, TopicSpec, spec_of
from kafka_broker import create_topic, unique_topic

ROOT = Path(__file__).resolve().parents[1]


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

    def record(spec, servers, security, create=True, grants=()):
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


# --- stream-vips topics -------------------------------------------------------------------------

def _config(tmp_path, bootstrap, names, *, weak=True, sink_extra=None):
    config = {
        "model": {"family": "linreg", "id": "m", "params": {"dim": 2}},
        "privacy": {"ledger": {"type": "kafka", "options": {
            "bootstrap_servers": bootstrap, "topic": names["ledger"], "name": "t",
            **({"allow_weak_durability": True} if weak else {})}}},
        "source": {"type": "kafka", "bootstrap_servers": bootstrap, "topics": names["in"]},
        "sink": {"type": "kafka", "bootstrap_servers": bootstrap, "topic": names["models"], **(sink_extra or {})},
        "dead_letter": {"type": "kafka", "bootstrap_servers": bootstrap, "topic": names["dead"]},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _names():
    return {k: unique_topic(f"tc-{k}") for k in ("in", "models", "dead", "ledger")}


@pytest.mark.kafka
def test_topics_create_makes_every_topic_on_one_broker_and_a_second_run_changes_nothing(kafka_bootstrap, tmp_path,
                                                                                     capsys):
    names = _names()
    config = _config(tmp_path, kafka_bootstrap, names)
    assert cli.main(["topics", "create", "--config", config, "--single-broker", "--partitions", "3"]) == 0
    out = capsys.readouterr().out
    header, _, results = out.partition("\n" + names["in"] + " (")
    # one line per topic on what one replica weakens, the ledger's precisely
    assert [line.split(" ")[2] for line in header.splitlines()[1:]] == [
        names["in"], names["models"], names["dead"], names["ledger"]]
    assert (f"  {names['ledger']} (privacy ledger): replication 1 (instead of 3), min.insync.replicas 1 "
            "(instead of 2): a lost broker disk loses the record of the spent budget for good") in header
    assert results.count(": created: ") == 4
    assert _describe(kafka_bootstrap, names["in"])[:2] == (3, 1)
    partitions, replicas, configs = _describe(kafka_bootstrap, names["models"])
    assert (partitions, replicas, configs["cleanup.policy"], configs["max.message.bytes"]) == (
        1, 1, "compact", "1048576")
    _, _, configs = _describe(kafka_bootstrap, names["ledger"])
    assert (configs["cleanup.policy"], configs["min.insync.replicas"]) == ("compact", "1")

    assert cli.main(["topics", "create", "--config", config, "--single-broker"]) == 0
    again = capsys.readouterr().out
    assert "created" not in again and again.count(": exists, fine") == 4
    assert cli.main(["topics", "check", "--config", config]) == 0  # what the connectors accept at start
    assert capsys.readouterr().out.count(": exists, fine") == 4


@pytest.mark.kafka
def test_an_existing_incompatible_topic_is_reported_and_left_alone(kafka_bootstrap, tmp_path, capsys):
    names = _names()
    create_topic(kafka_bootstrap, names["models"])  # not compacted: compaction would drop nothing, and keep nothing
    config = _config(tmp_path, kafka_bootstrap, names)
    assert cli.main(["topics", "create", "--config", config, "--single-broker"]) == 1
    captured = capsys.readouterr()
    assert (f"{names['models']} (model topic, sink.topic): INCOMPATIBLE: topic {names['models']!r} exists with "
            "incompatible settings: cleanup.policy='delete' (needs 'compact')") in captured.out
    assert captured.out.count(": created: ") == 3  # the others are created all the same
    assert "1 topic(s) not as their connectors require" in captured.err
    assert _describe(kafka_bootstrap, names["models"])[2]["cleanup.policy"] == "delete"  # unchanged


@pytest.mark.kafka
def test_check_reports_missing_topics_and_create_respects_create_topic_false(kafka_bootstrap, tmp_path, capsys):
    names = _names()
    config = _config(tmp_path, kafka_bootstrap, names, sink_extra={"create_topic": False})
    assert cli.main(["topics", "check", "--config", config]) == 1
    assert capsys.readouterr().out.count(": MISSING") == 4
    assert cli.main(["topics", "create", "--config", config, "--single-broker"]) == 1
    out = capsys.readouterr().out
    assert f"{names['models']} (model topic, sink.topic): MISSING (create_topic is false" in out
    assert out.count(": created: ") == 3


@pytest.mark.kafka
def test_without_weak_durability_one_broker_is_refused_naming_what_fixes_it(kafka_bootstrap, tmp_path, capsys):
    names = _names()
    config = _config(tmp_path, kafka_bootstrap, names, weak=False)
    assert cli.main(["topics", "create", "--config", config, "--single-broker"]) == 2
    err = capsys.readouterr().err
    assert "privacy.ledger.options.allow_weak_durability: must be true with --single-broker" in err
    assert cli.main(["topics", "check", "--config", config]) == 1
    assert capsys.readouterr().out.count(": MISSING") == 4  # nothing was created
    assert cli.main(["topics", "create", "--config", config]) == 1  # the ledger's 3 replicas do not fit
    out = capsys.readouterr().out
    assert (f"{names['ledger']} (privacy ledger, privacy.ledger.options.topic): NOT CREATED: cannot create topic "
            f"{names['ledger']!r} with replication factor 3: InvalidReplicationFactorError") in out
    assert "on one broker use --single-broker" in out


def test_a_mistyped_key_fails_before_any_broker_is_asked(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("source: {type: kafka, bootstrap_servers: '127.0.0.1:1', topics: a, until_ned: true}\n")
    assert cli.main(["topics", "create", "--config", str(path)]) == 2
    assert "configuration error: source.until_ned: unknown key" in capsys.readouterr().err
    path.write_text("source: {type: jsonl, path: x.jsonl}\n")
    assert cli.main(["topics", "check", "--config", str(path)]) == 2
    assert "names no Kafka topic" in capsys.readouterr().err
    path.write_text("source: {type: kafka, bootstrap_servers: '127.0.0.1:1', topics: a, security_protocol: SASL}\n")
    assert cli.main(["topics", "create", "--config", str(path)]) == 2
    assert "configuration error: source: security_protocol must be" in capsys.readouterr().err


def test_an_unreachable_broker_is_one_line_and_exit_code_5(tmp_path, capsys):
    import time

    path = tmp_path / "c.yaml"
    path.write_text("source: {type: kafka, bootstrap_servers: '127.0.0.1:1', topics: a}\n")
    started = time.monotonic()
    assert cli.main(["topics", "create", "--config", str(path), "--timeout-s", "1"]) == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stream-vips topics: Kafka at 127.0.0.1:1: KafkaTimeoutError" in err
    assert time.monotonic() - started < 15


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


def test_the_production_kafka_ledger_of_the_deploy_guide_is_valid_and_durable():
    from stream_vips.service.build import config_from_dict

    snippet = re.search(r"```yaml\n(  ledger:\n.*?)```", (ROOT / "docs" / "deploy.md").read_text(), flags=re.S)
    config = yaml.safe_load((ROOT / "k8s" / "base" / "app" / "config.yaml").read_text())
    config["privacy"]["ledger"] = yaml.safe_load(snippet.group(1))["ledger"]
    options = config_from_dict(config, env={}).privacy.ledger.options
    (spec,) = spec_of(KafkaLedger, options)
    assert (spec.min_replication, spec.fits_cluster, spec.configs["min.insync.replicas"]) == (3, False, "2")
