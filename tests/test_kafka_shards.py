"""The sharded runtime on the real broker: each shard assigned the partitions p with p mod N = i,
no group rebalance, steps over all of them, and a changed partition count refused at start."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewPartitions

from connectors.kafka import KafkaConnectorError, KafkaSource
from kafka_broker import CLIENTS, create_topic, produce, unique_topic
from stream_vips.config import ConfigError
from stream_vips.distributed import LocalPool, ShardedLearner
from stream_vips.service.build import config_from_dict, shard_connectors
from test_distributed import records

pytestmark = pytest.mark.kafka


def kafka_settings(bootstrap: str, topic: str, group: str, shards: int, client: str) -> dict[str, Any]:
    return {
        "model": {"family": "linreg", "params": {"dim": 2}},
        "source": {"type": "kafka", "bootstrap_servers": bootstrap, "topics": topic, "group_id": group,
                   "until_end": True, "client": client, "commit_interval_s": 0},
        "dead_letter": {"type": "memory"},
        "sampling": {"reservoir": 60, "batch_size": 12},
        "schedule": {"every_records": 30},
        "privacy": {"epsilon": 3.0, "seed": 5, "ledger": {"type": "memory"}, "planned_steps": 8},
        "runtime": {"shards": shards, "poll_timeout_s": 0.5, "poll_max_records": 15},
    }


@pytest.mark.parametrize("client", CLIENTS)
def test_shards_read_their_own_partitions_and_step_over_all(kafka_bootstrap: str, client: str) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("shards"), partitions=4)
    produce(kafka_bootstrap, topic, [json.dumps(r).encode() for r in records(200)], partitions=4)
    cfg = config_from_dict(kafka_settings(kafka_bootstrap, topic, unique_topic("g"), 2, client), env={})
    sources, dead = shard_connectors(cfg)
    pool = LocalPool(cfg, 2, sources=sources, dead_letters=dead)
    try:
        held = [set(shard._source._client.assignment()) for shard in pool.members]  # type: ignore[union-attr]
        assert held == [{(topic, 0), (topic, 2)}, {(topic, 1), (topic, 3)}]
        with ShardedLearner(cfg, pool) as learner:
            deadline = time.monotonic() + 60
            while sum(s.seen for s in learner.slices.statuses if s is not None) < 200:
                assert time.monotonic() < deadline, "the shards did not read every record"
                learner.poll()
            assert [s.seen for s in learner.slices.statuses if s is not None] == [100, 100]
            assert learner.steps_taken >= 3
            assert learner.ledger is not None and len(learner.ledger.events()) == learner.steps_taken
            held_after = [set(shard._source._client.assignment()) for shard in pool.members]  # type: ignore
            assert held_after == held  # assigned, never rebalanced
    finally:
        pool.close()
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:  # every shard committed its own partitions, through the one group
        offsets = admin.list_group_offsets(cfg.source.options["group_id"])[cfg.source.options["group_id"]]
        assert {tp.partition: om.offset for tp, om in offsets.items()} == {0: 50, 1: 50, 2: 50, 3: 50}
    finally:
        admin.close()


def test_a_changed_partition_count_is_refused_at_start(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("grow"), partitions=2)
    cfg = config_from_dict(kafka_settings(kafka_bootstrap, topic, unique_topic("g"), 2, "kafka-python"), env={})
    sources, _ = shard_connectors(cfg)  # laid out for 2 partitions
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_partitions({topic: NewPartitions(total_count=3)})
    finally:
        admin.close()
    factory = sources(0)
    assert factory is not None
    with pytest.raises(KafkaConnectorError, match="has 3 partitions, but this source was laid out for 2"):
        deadline = time.monotonic() + 30
        while True:  # the new partition reaches the metadata within moments
            source = factory()
            assert isinstance(source, KafkaSource)
            source.close()
            assert time.monotonic() < deadline
            time.sleep(0.5)


def test_more_shards_than_partitions_are_refused_at_start(kafka_bootstrap: str) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("few"), partitions=1)
    cfg = config_from_dict(kafka_settings(kafka_bootstrap, topic, unique_topic("g"), 2, "kafka-python"), env={})
    with pytest.raises(ConfigError, match="^runtime.shards: 2 shards need at least 2 input partitions"):
        shard_connectors(cfg)


def test_shards_need_a_partitioned_source() -> None:
    cfg = config_from_dict({"source": {"type": "memory"}, "runtime": {"shards": 2},
                            "privacy": {"ledger": {"type": "memory"}}}, env={})
    with pytest.raises(ConfigError, match="^source.type: runtime.shards: 2 needs a partitioned source"):
        shard_connectors(cfg)


def test_stream_vips_run_with_shards_publishes_and_pays_one_ledger(kafka_bootstrap: str, tmp_path: Any) -> None:
    """``stream-vips run`` with runtime.shards: 2 (in this process): the shards read the topic,
    the driver writes one ledger and publishes models whose version is the ledger step; a
    restarted driver on the same ledger goes on counting from it (rule 7), never from zero."""
    import yaml

    from stream_vips.cli import main
    from stream_vips.privacy.ledger import FileLedger

    topic = create_topic(kafka_bootstrap, unique_topic("run"), partitions=2)
    produce(kafka_bootstrap, topic, [json.dumps(r).encode() for r in records(200)], partitions=2)
    settings = kafka_settings(kafka_bootstrap, topic, unique_topic("g"), 2, "kafka-python")
    settings["sink"] = {"type": "jsonl", "path": str(tmp_path / "models.jsonl")}
    settings["dead_letter"] = {"type": "jsonl", "path": str(tmp_path / "dead.jsonl")}
    settings["privacy"]["ledger"] = {"type": "file", "path": str(tmp_path / "ledger.jsonl")}
    settings["runtime"]["publish_interval_s"] = 0
    settings["metrics"] = {"enabled": False}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    assert main(["run", "--config", str(path), "--no-progress"]) == 0
    models = [json.loads(line) for line in (tmp_path / "models.jsonl").read_text().splitlines()]
    ledger = FileLedger(str(tmp_path / "ledger.jsonl"))
    try:
        steps = len(ledger.events())
    finally:
        ledger.close()
    assert steps >= 3 and [m["version"] for m in models] == list(range(steps))
    assert models[-1]["privacy"]["steps"] == steps
    # the driver killed and started again: the committed offsets leave nothing to read, the ledger keeps its steps
    produce(kafka_bootstrap, topic, [json.dumps(r).encode() for r in records(100, seed=2)], partitions=2)
    assert main(["run", "--config", str(path), "--no-progress"]) == 0
    models = [json.loads(line) for line in (tmp_path / "models.jsonl").read_text().splitlines()]
    assert models[-1]["version"] >= steps and models[-1]["privacy"]["epsilon_spent"] > models[steps - 1]["privacy"][
        "epsilon_spent"]


@pytest.mark.parametrize("over, key", [
    ({"privacy": {"accounting": "window", "ledger": {"type": "memory"}}, "runtime": {"shards": 2},
      "sampling": {"reservoir_policy": "window"}}, "privacy.accounting"),
])
def test_what_the_sharded_service_cannot_do_yet_is_refused(over: dict[str, Any], key: str) -> None:
    cfg = config_from_dict({"source": {"type": "kafka", "bootstrap_servers": "localhost:1", "topics": "t"},
                            "privacy": {"ledger": {"type": "memory"}}, **over}, env={})
    with pytest.raises(ConfigError, match=f"^{key}:"):
        shard_connectors(cfg)
