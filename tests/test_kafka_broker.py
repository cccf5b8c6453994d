"""The test broker itself: it serves metadata, produce/consume round trips, and SASL/PLAIN auth."""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from kafka_broker import SASL_PASSWORD, SASL_USER, create_topic, produce, unique_topic

pytestmark = pytest.mark.kafka


def test_broker_lists_itself_and_round_trips_records(kafka_broker):
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        brokers = admin.describe_cluster()["brokers"]
    finally:
        admin.close()
    assert [b["port"] for b in brokers] == [kafka_broker.port]

    topic = create_topic(kafka_broker.bootstrap, unique_topic("smoke"), partitions=2)
    values = [f"v{i}".encode() for i in range(50)]
    placed = produce(kafka_broker.bootstrap, topic, values, partitions=2)
    assert sorted(placed) == sorted((p, o) for p in range(2) for o in range(25))

    cons = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False,
                         auto_offset_reset="earliest", consumer_timeout_ms=10000)
    cons.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    got = []
    for m in cons:
        got.append(m.value)
        if len(got) == len(values):
            break
    cons.close()
    got.sort()
    assert got == sorted(values)


def _sasl_admin(broker, password: str, **kw) -> KafkaAdminClient:
    return KafkaAdminClient(**kw, bootstrap_servers=broker.sasl_bootstrap, security_protocol="SASL_PLAINTEXT",
                            sasl_mechanism="PLAIN", sasl_plain_username=SASL_USER,
                            sasl_plain_password=password, request_timeout_ms=5000)


def test_sasl_listener_accepts_the_configured_user_only(kafka_broker):
    admin = _sasl_admin(kafka_broker, SASL_PASSWORD)
    try:
        assert admin.describe_cluster()["brokers"]
    finally:
        admin.close()
    with pytest.raises(KafkaError):
        _sasl_admin(kafka_broker, "wrong-password", bootstrap_timeout_ms=3000).describe_cluster()


def test_a_broker_on_a_port_another_cluster_serves_is_refused_not_taken_for_ready(kafka_broker):
    """Started on the session broker's port, a second broker cannot bind it; the first one
    answering there must not count as the second being ready (the README walkthrough's
    ``serve --port 9092`` next to another Kafka on the machine)."""
    from kafka_broker import BrokerError, KafkaBroker

    other = KafkaBroker(port=kafka_broker.port)
    try:
        with pytest.raises(BrokerError, match=f"port {kafka_broker.port} is taken by another Kafka cluster"):
            other.start(timeout_s=60)
    finally:
        other.cleanup()
