"""Shared pytest fixtures."""

from __future__ import annotations

import pytest


# --- Kafka: one real Apache Kafka broker (KRaft, loopback) per test session -------------------------

@pytest.fixture(scope="session")
def kafka_broker():
    """A running single-node broker; skipped with a reason locally, a failure under CI=true."""
    from kafka_broker import BrokerError, KafkaBroker, in_ci

    broker = KafkaBroker()
    try:
        broker.start()
    except BrokerError as exc:
        broker.cleanup()
        if in_ci():
            pytest.fail(f"Kafka broker could not start under CI: {exc}", pytrace=False)
        pytest.skip(f"Kafka broker could not start: {exc}")
    yield broker
    broker.cleanup()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker) -> str:
    return kafka_broker.bootstrap
