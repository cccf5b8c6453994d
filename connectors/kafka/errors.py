"""The Kafka connectors' error vocabulary: the errors they raise, and how a failure of either
client library is classified (worth a retry or not, a commit the group refused, how a failed send
is named).

This module is the bottom of the package: it imports none of the package's other modules, so
every one of them, both client libraries' sides included, can use it. The client libraries
themselves are imported only inside the functions that read their errors.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from stream_vips.errors import StreamVipsError


class KafkaConnectorError(StreamVipsError, RuntimeError):
    """A Kafka connector cannot do what its configuration asks (names the topic and setting)."""


class KafkaPublishError(KafkaConnectorError):
    """A send was not acknowledged by the broker; nothing is dropped silently."""


class KafkaAccessDenied(KafkaConnectorError):
    """The broker refused this client: its login failed, or its principal lacks an ACL.

    ``principal`` (``User:<name>``), ``operations`` (Kafka ACL operation names, empty for a failed
    login) and ``resource`` (``topic 'name'``, ``group 'name'``, ``transactionalId 'name'``, or the
    bootstrap servers for a login) say what to fix; the message is one line and says the same.
    ``stream-vips run``, ``inspect`` and ``report`` exit with code 7 on it.
    """

    def __init__(self, message: str, *, principal: str, operations: Sequence[str] = (), resource: str = "") -> None:
        super().__init__(" ".join(message.split()))
        self.principal = principal
        self.operations = tuple(operations)
        self.resource = resource

    @property
    def operation(self) -> str:
        """The missing operations, comma-separated (empty for a failed login)."""
        return ", ".join(self.operations)


class CommitRefused(Exception):
    """The group rebalanced: the commit was refused and the partition's new owner resumes from
    the last committed offset."""


def part_label(what: str, i: int, n: int) -> str:
    """How a failed send of item ``i`` of ``n`` is named in an error.

    >>> part_label("ledger events", 0, 1), part_label("model 'm'", 1, 3)
    ('ledger events', "model 'm' part 2/3")
    """
    return what if n == 1 else f"{what} part {i + 1}/{n}"


@functools.cache
def _transient_codes() -> frozenset[int]:
    """confluent-kafka error codes that a later attempt can get past (a broker or coordinator
    away for a while), beyond those librdkafka itself marks retriable."""
    from confluent_kafka import KafkaError

    return frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                      KafkaError._WAIT_COORD, KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_COORDINATOR,
                      KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                      KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
                      KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND})


def transient(error: Any) -> bool:
    """True when confluent-kafka's ``KafkaError`` ``error`` is worth retrying (never for a fatal
    one, e.g. a fenced producer)."""
    return not error.fatal() and (error.retriable() or error.code() in _transient_codes())


def retriable(exc: BaseException) -> bool:
    """True when the Kafka error behind ``exc`` is transient (a broker away, a timeout), for
    either client: kafka-python's errors carry a ``retriable`` flag, confluent-kafka's
    ``KafkaException`` wraps a ``KafkaError`` (:func:`transient`)."""
    from kafka.errors import KafkaTimeoutError

    cause = exc.__cause__ or exc
    error = cause.args[0] if cause.args else None
    if callable(getattr(error, "retriable", None)):
        return transient(error)
    return isinstance(cause, KafkaTimeoutError) or getattr(cause, "retriable", False) is True
