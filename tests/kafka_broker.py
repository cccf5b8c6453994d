"""Helpers for tests that run against the real Apache Kafka broker (tools/kafka/broker.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

#: The Kafka client libraries the connectors can run on (``client`` of a connection); tests of
#: the connectors' invariants run on each (``@pytest.mark.parametrize("client", CLIENTS)``).
from connectors.kafka.connection import CLIENTS as CLIENTS  # re-exported for the tests

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("stream_vips_kafka_broker", ROOT / "tools" / "kafka" / "broker.py")
broker_mod = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = broker_mod
_spec.loader.exec_module(broker_mod)

KafkaBroker = broker_mod.KafkaBroker
BrokerError = broker_mod.BrokerError
SASL_USER = broker_mod.SASL_USER
SASL_PASSWORD = broker_mod.SASL_PASSWORD
ADMIN_USER = broker_mod.ADMIN_USER
ADMIN_PASSWORD = broker_mod.ADMIN_PASSWORD


#: Kafka ledger options for the single-broker test cluster (one replica; production needs 3 / 2).
WEAK_LEDGER = {"replication_factor": 1, "min_insync_replicas": 1, "allow_weak_durability": True}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1,
                 configs: Mapping[str, str] | None = None) -> str:
    """Create a topic with replication factor 1 and wait until its leaders are known."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=dict(configs or {}))])
    finally:
        admin.close()
    return name


def produce(bootstrap: str, topic: str, values: Iterable[bytes], partitions: int = 1,
            key_fn=None) -> list[tuple[int, int]]:
    """Produce ``values`` round-robin over ``partitions``; returns (partition, offset) per value."""
    from kafka import KafkaProducer

    prod = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                         batch_size=256 * 1024, max_in_flight_requests_per_connection=5)
    try:
        futures = [prod.send(topic, value=v, partition=i % partitions,
                             key=key_fn(i) if key_fn else None) for i, v in enumerate(values)]
        prod.flush()
        out = []
        for f in futures:
            md = f.get(timeout=30)
            out.append((md.partition, md.offset))
        return out
    finally:
        prod.close()


def linreg_records(n: int, dim: int = 4, seed: int = 0) -> list[bytes]:
    """``n`` JSON records ``{"x": [...], "y": ...}`` from a fixed linear model (public test data)."""
    import json

    import numpy as np

    rng = np.random.default_rng(seed)
    w = np.linspace(-1.0, 1.0, dim)
    X = rng.normal(scale=0.4, size=(n, dim))
    y = X @ w + rng.normal(scale=0.1, size=n)
    return [json.dumps({"x": xi, "y": yi}).encode() for xi, yi in zip(X.round(6).tolist(), y.round(6).tolist())]


def pipeline_config(bootstrap: str, *, input_topic: str, model_topic: str, dead_letter_topic: str,
                    group_id: str, model_id: str = "m", reservoir: int = 5000, batch_size: int = 500,
                    every_records: int = 5000, epsilon: float = 2.0, planned_steps: int = 20,
                    source_options: dict | None = None, sink_options: dict | None = None,
                    seed: int | None = None, noise_multiplier: float | None = None,
                    client: str = "kafka-python") -> dict:
    """The YAML layout of a Kafka-to-Kafka linreg pipeline used by the end-to-end tests, every
    Kafka connector on the ``client`` library (:func:`build_app` gives the Kafka ledger the
    source's).

    ``noise_multiplier=None`` calibrates z to ``epsilon`` over ``planned_steps`` (seconds of
    PLD work); tests that do not exercise halting pass a fixed z and a large budget.
    """
    return {
        "model": {"family": "linreg", "id": model_id, "params": {"dim": 4}},
        "privacy": {"epsilon": epsilon, "delta": 1e-5, "planned_steps": planned_steps, "seed": seed,
                    "noise_multiplier": noise_multiplier,
                    "ledger": {"type": "memory"}},
        "sampling": {"method": "poisson", "reservoir": reservoir, "batch_size": batch_size},
        "schedule": {"every_records": every_records},
        "source": {"type": "kafka", "bootstrap_servers": bootstrap, "topics": input_topic,
                   "group_id": group_id, "client": client, **(source_options or {})},
        "sink": {"type": "kafka", "bootstrap_servers": bootstrap, "topic": model_topic,
                 "transactional_id": f"{group_id}-models", "client": client, **(sink_options or {})},
        "dead_letter": {"type": "kafka", "bootstrap_servers": bootstrap, "topic": dead_letter_topic,
                        "client": client},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 5000, "poll_timeout_s": 0.2, "publish_interval_s": 0.0},
    }


def build_app(spec: dict):
    """An Application from ``spec`` = {"config": ..., "ledger_topic", "ledger_id", ["checkpoint"]}
    with the Kafka ledger configured as ``privacy.ledger`` (type kafka), and (when ``checkpoint``
    is given) the reservoir checkpoint attached."""
    from stream_vips.service.app import Application
    from stream_vips.service.build import config_from_dict

    config = {**spec["config"]}
    if spec.get("ledger_path"):
        config["privacy"] = {**config["privacy"], "ledger": {"type": "file", "path": spec["ledger_path"]}}
    else:
        config["privacy"] = {**config["privacy"], "ledger": {"type": "kafka", "options": {
            "bootstrap_servers": config["source"]["bootstrap_servers"], "topic": spec["ledger_topic"],
            "ledger_id": spec["ledger_id"], "client": config["source"].get("client", "kafka-python"),
            **WEAK_LEDGER}}}
    if spec.get("checkpoint"):
        config["runtime"] = {**config.get("runtime", {}), "checkpoint_path": spec["checkpoint"],
                             "checkpoint_interval_s": spec.get("checkpoint_interval_s", 0.0)}
    return Application.from_config(config_from_dict(config, env={}))


class _RecordingSource:
    """Appends ``partition offset`` of every polled record to a file before the pipeline sees it."""

    def __init__(self, inner, path: str) -> None:
        self.inner = inner
        self._log = open(path, "a")

    def poll(self, max_records: int, timeout_s: float):
        out = self.inner.poll(max_records, timeout_s)
        if out:
            self._log.write("".join(f"{r.origin['partition']} {r.origin['offset']}\n" for r in out))
            self._log.flush()
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _child(spec_path: str) -> int:
    """Run one pipeline process from a JSON spec (the SIGKILL restart test starts this)."""
    import json

    spec = json.loads(Path(spec_path).read_text())
    app = build_app(spec)
    app.source = _RecordingSource(app.source, spec["consumed_log"])
    app.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1]))
