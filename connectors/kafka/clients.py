"""The client-library seam: what the connectors need from a Kafka consumer
(:class:`ConsumerClient`) and producer (:class:`ProducerClient`), and the factories that give a
connection's client library behind it (:func:`consumer_client`, :func:`producer_client`).

The connectors keep every rule (offset bookkeeping, the duplicate guard, commits before
revocation, transactions and their retries, dead letters confirmed before a commit) and call a
client only through these few methods, so both libraries run the same logic. Partitions are
``(topic, partition)`` tuples at this seam (kafka-python's ``TopicPartition`` is such a tuple).

Each library has its side in a module of its own: :mod:`connectors.kafka.kafka_python` and
:mod:`connectors.kafka.confluent`. They sit below this module and never import it (what they
share with it, :class:`~connectors.kafka.rebalance.Rebalance` and the errors, is further down),
so :func:`client_for` imports the side a connection names inside the function: the package
keeps no import cycle, and a process loads confluent-kafka only when a connection uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from connectors.kafka.connection import ClientName, KafkaConnection
from connectors.kafka.rebalance import TP, Rebalance


class ConsumerClient(Protocol):
    """A subscribed group member with manual commits (see
    :class:`~connectors.kafka.kafka_python.KafkaPythonConsumer`)."""

    raw: Any
    offset_of: Callable[[Any], int]
    value_of: Callable[[Any], bytes]

    def subscribe(self, topics: list[str], hooks: Rebalance) -> None: ...

    def assign(self, tps: list[TP], hooks: Rebalance) -> None:
        """Take exactly these partitions, outside any group rebalance (the sharded runtime: a
        shard's partitions never move); each starts at the group's committed offset."""
        ...

    def fetch(self, max_records: int, timeout_s: float) -> list[tuple[TP, list]]: ...

    def origin(self, topic: str, partition: int) -> Callable[[Any], dict[str, Any]]: ...

    def assignment(self) -> set[TP]: ...

    def paused(self) -> set[TP]: ...

    def pause(self, tps: Iterable[TP]) -> None: ...

    def resume(self, tps: Iterable[TP]) -> None: ...

    def commit(self, offsets: Mapping[TP, int], timeout_s: float) -> None: ...

    def seek(self, tp: TP, offset: int) -> None: ...

    def highwater(self, tp: TP) -> int | None: ...

    def at_end(self, tps: set[TP], floors: Mapping[TP, int]) -> bool: ...

    def keepalive(self) -> None: ...

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Partitions of each topic from the cluster's metadata (0: missing, or not visible)."""
        ...

    def rejoin(self) -> None:
        """Ask the group for a new assignment (see
        :meth:`~connectors.kafka.kafka_python.KafkaPythonConsumer.rejoin`)."""
        ...

    def close(self) -> None: ...


class ProducerClient(Protocol):
    """An idempotent (optionally transactional) producer whose sends are confirmed in bulk."""

    raw: Any

    def init_transactions(self) -> None: ...

    def begin(self) -> None: ...

    def send(self, topic: str, value: bytes, key: bytes | None = None,
             headers: Sequence[tuple[str, bytes]] | None = None, partition: int | None = None) -> Any: ...

    def confirm(self, handles: Sequence[Any], timeout_s: float, what: str) -> None:
        """Wait for every send in ``handles``; :class:`KafkaPublishError` naming ``what`` if one failed."""
        ...

    def flush(self, timeout_s: float) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def partitions(self, topic: str) -> int: ...

    def close(self, timeout_s: float) -> None: ...


def client_for(name: ClientName) -> tuple[Callable[..., ConsumerClient], Callable[..., ProducerClient]]:
    """The consumer and producer classes of the client library ``name`` (``KafkaConnection.client``),
    each built as ``(connection, client_id, settings)``; the library's side is imported here, on
    first use (see the module's docstring)."""
    if name == "confluent":
        from connectors.kafka.confluent import ConfluentConsumer, ConfluentProducer

        return ConfluentConsumer, ConfluentProducer
    from connectors.kafka.kafka_python import KafkaPythonConsumer, KafkaPythonProducer

    return KafkaPythonConsumer, KafkaPythonProducer


def consumer_client(connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> ConsumerClient:
    """The connection's client library as a consumer; ``settings`` are kafka-python's names."""
    consumer, _ = client_for(connection.client)
    return consumer(connection, client_id, settings)


def producer_client(connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> ProducerClient:
    """The connection's client library as a producer; ``settings`` are kafka-python's names."""
    _, producer = client_for(connection.client)
    return producer(connection, client_id, settings)
