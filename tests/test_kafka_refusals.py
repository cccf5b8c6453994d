"""A broker's refusal, from either client library, becomes one line naming what to grant (no broker
needed here; tests/test_kafka_access.py has the real ones)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from kafka.errors import GroupAuthorizationFailedError, SaslAuthenticationFailedError, TopicAuthorizationFailedError

from connectors.kafka import (
    Grant,
    KafkaAccessDenied,
    KafkaDeadLetterSink,
    KafkaLedger,
    KafkaModelSink,
    KafkaPublishError,
    KafkaSource,
    connector_grants,
    principal,
)
from connectors.kafka.access import authentication_failed, denial

SCRAM = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "stream-vips",
         "sasl_plain_password": "not-shown"}
WRITE_TXN = Grant("transactionalId", "stream-vips-models", "Write", "the model sink writes in transactions",
                  "connectors.kafka.sink.KafkaModelSink._new_producer")


@pytest.mark.parametrize("exc", [
    TopicAuthorizationFailedError("stream-vips.models"),
    KafkaException(KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                              "Transactional Id authorization failed")),
], ids=["kafka-python", "confluent"])
def test_a_refusal_of_either_library_is_named_as_the_grant_the_call_needed(exc):
    grant = (WRITE_TXN if isinstance(exc, KafkaException)
             else Grant("topic", "stream-vips.models", "Read", "the model sink reads the latest model back at start"))
    denied = denial(exc, SCRAM, grant)
    assert isinstance(denied, KafkaAccessDenied)
    assert (denied.principal, denied.operation, denied.resource) == ("User:stream-vips", grant.operation,
                                                                      grant.resource)
    assert str(denied).startswith(f"not authorized: User:stream-vips needs {grant.operation} on {grant.resource} "
                                  f"({grant.why}")
    assert "not-shown" not in str(denied)


def test_a_refusal_inside_a_publish_error_is_found_and_named_from_the_error_alone():
    try:
        try:
            raise GroupAuthorizationFailedError("stream-vips")
        except GroupAuthorizationFailedError as inner:
            raise KafkaPublishError("wrapped") from inner
    except KafkaPublishError as exc:
        denied = denial(exc, SCRAM)
    assert (denied.operation, denied.resource) == ("Read", "group 'stream-vips'")
    assert "\n" not in str(denied)


def test_only_the_brokers_refusals_count():
    assert denial(OSError(29, "Illegal seek"), SCRAM) is None  # an OS errno that equals a Kafka code
    assert denial(KafkaException(KafkaError(KafkaError._TRANSPORT)), SCRAM) is None
    assert denial(RuntimeError("x"), SCRAM) is None


def test_a_failed_login_names_user_and_mechanism_in_one_line():
    denied = denial(SaslAuthenticationFailedError("Authentication failed during authentication due to invalid\n"
                                                  "credentials with SASL mechanism SCRAM-SHA-512"), SCRAM,
                    servers=["b1:9093"])
    assert str(denied).startswith("authentication failed for user stream-vips (mechanism SCRAM-SHA-512) at b1:9093: ")
    assert "\n" not in str(denied) and "not-shown" not in str(denied) and denied.operations == ()
    librdkafka = authentication_failed(SCRAM, ["b1:9093"], "sasl_ssl://b1:9093/bootstrap: SASL authentication error: "
                                       "Authentication failed (after 312ms in state AUTH_REQ)")
    assert ": Authentication failed; check the user name" in str(librdkafka)


def test_principals():
    assert principal(SCRAM) == "User:stream-vips"
    assert principal({"security_protocol": "PLAINTEXT"}) == "User:ANONYMOUS"
    assert "client certificate" in principal({"security_protocol": "SSL", "ssl_certfile": "/c.pem"})


def test_each_connector_declares_its_grants_from_its_own_settings():
    grants = {(g.resource, g.operation) for g in connector_grants(KafkaSource, {"topics": ["a", "b"], "group_id": "g"})}
    assert grants == {("topic 'a'", "Read"), ("topic 'b'", "Read"), ("group 'g'", "Read")}
    fixed = connector_grants(KafkaModelSink, {"topic": "m", "transactional_id": "tx", "create_topic": False})
    assert {(g.resource, g.operation) for g in fixed} == {("topic 'm'", "Write"), ("topic 'm'", "Read"),
                                                          ("topic 'm'", "DescribeConfigs"),
                                                          ("transactionalId 'tx'", "Write")}
    random_id = connector_grants(KafkaModelSink, {"topic": "m"})  # defaults: a random id, create_topic true
    assert ("transactionalId prefix 'stream-vips-models-'", "Write") in {(g.resource, g.operation) for g in random_id}
    assert ("topic 'm'", "Create") in {(g.resource, g.operation) for g in random_id}
    assert {g.operation for g in connector_grants(KafkaDeadLetterSink, {"create_topic": False})} == {
        "Write", "DescribeConfigs"}
    ledger = connector_grants(KafkaLedger, {"topic": "l", "create_topic": False})
    assert ("transactionalId prefix 'stream-vips-ledger-'", "Write") in {(g.resource, g.operation) for g in ledger}
    assert all(g.why and g.code for g in ledger)
