"""Helpers for tests that run against the real Apache Kafka broker (tools/kafka/broker.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from pathlib import Path
from typing import Iterable, Mapping

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("stream_vips_kafka_broker", ROOT / "tools" / "kafka" / "broker.py")
broker_mod = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = broker_mod
_spec.loader.exec_module(broker_mod)

KafkaBroker = broker_mod.KafkaBroker
BrokerError = broker_mod.BrokerError
SASL_USER = broker_mod.SASL_USER
SASL_PASSWORD = broker_mod.SASL_PASSWORD


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
