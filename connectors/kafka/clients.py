"""The client-library seam: what the connectors need from a Kafka consumer and producer, with the
kafka-python implementation; :mod:`connectors.kafka.confluent` has the confluent-kafka one.

The connectors keep every rule (offset bookkeeping, the duplicate guard, commits before
revocation, transactions and their retries, dead letters confirmed before a commit) and call a
client only through these few methods, so both libraries run the same logic. Partitions are
``(topic, partition)`` tuples at this seam (kafka-python's ``TopicPartition`` is such a tuple).
"""

from __future__ import annotations

from functools import partial
from operator import attrgetter
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from connectors.kafka.connection import KafkaConnection
from connectors.kafka.errors import CommitRefused, KafkaPublishError, part_label

TP = tuple  # (topic, partition)


class Rebalance(Protocol):
    """What a consumer client calls when the group's assignment changes (the source's hooks)."""

    def revoking(self, revoked: set[TP]) -> dict[TP, int]: ...

    def revoke_committed(self, offsets: Mapping[TP, int]) -> None: ...

    def assigned(self, assigned: set[TP]) -> dict[TP, int]: ...

    @property
    def halted(self) -> bool: ...


class ConsumerClient(Protocol):
    """A subscribed group member with manual commits (see :class:`KafkaPythonConsumer`)."""

    raw: Any
    offset_of: Callable[[Any], int]
    value_of: Callable[[Any], bytes]

    def subscribe(self, topics: list[str], hooks: Rebalance) -> None: ...

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
        """Ask the group for a new assignment (see :meth:`KafkaPythonConsumer.rejoin`)."""
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


def consumer_client(connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> ConsumerClient:
    """The connection's client library as a consumer; ``settings`` are kafka-python's names."""
    if connection.client == "confluent":
        from connectors.kafka.confluent import ConfluentConsumer

        return ConfluentConsumer(connection, client_id, settings)
    return KafkaPythonConsumer(connection, client_id, settings)


def producer_client(connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> ProducerClient:
    """The connection's client library as a producer; ``settings`` are kafka-python's names."""
    if connection.client == "confluent":
        from connectors.kafka.confluent import ConfluentProducer

        return ConfluentProducer(connection, client_id, settings)
    return KafkaPythonProducer(connection, client_id, settings)


# -- kafka-python --------------------------------------------------------------------------------

class KafkaPythonConsumer:
    """kafka-python's ``KafkaConsumer`` behind :class:`ConsumerClient`."""

    offset_of = attrgetter("offset")
    value_of = attrgetter("value")

    def __init__(self, connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> None:
        from kafka import KafkaConsumer

        self.raw = KafkaConsumer(**connection.client_options(client_id), **settings)

    def subscribe(self, topics: list[str], hooks: Rebalance) -> None:
        from connectors.kafka.source import _SeekListener

        self.raw.subscribe(topics, listener=_SeekListener(hooks))

    def fetch(self, max_records: int, timeout_s: float) -> list[tuple[TP, list]]:
        return list(self.raw.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records).items())

    def origin(self, topic: str, partition: int) -> Callable[[Any], dict[str, Any]]:
        return partial(_origin, topic, partition)

    def assignment(self) -> set[TP]:
        return set(self.raw.assignment())

    def paused(self) -> set[TP]:
        return set(self.raw.paused())

    def pause(self, tps: Iterable[TP]) -> None:
        self.raw.pause(*map(_tp, tps))

    def resume(self, tps: Iterable[TP]) -> None:
        self.raw.resume(*map(_tp, tps))

    def commit(self, offsets: Mapping[TP, int], timeout_s: float) -> None:
        from kafka.errors import CommitFailedError

        try:
            self.raw.commit(_offsets(offsets), timeout_ms=int(timeout_s * 1000))
        except CommitFailedError as exc:
            raise CommitRefused(str(exc)) from exc

    async def commit_in_callback(self, offsets: Mapping[TP, int], timeout_s: float) -> None:
        """Commit from a rebalance listener, which kafka-python runs on its IO thread: the blocking
        ``commit()`` would wait on that same thread, so this awaits the coordinator's commit
        coroutine (a private kafka-python 3.0 API, the only synchronous commit there)."""
        await self.raw._coordinator._commit_offsets_sync_async(_offsets(offsets), timeout_ms=int(timeout_s * 1000))

    def seek(self, tp: TP, offset: int) -> None:
        self.raw.seek(_tp(tp), offset)

    def highwater(self, tp: TP) -> int | None:
        return self.raw.highwater(_tp(tp))

    def at_end(self, tps: set[TP], floors: Mapping[TP, int]) -> bool:
        from kafka.errors import KafkaError

        try:
            ends = self.raw.end_offsets([_tp(tp) for tp in tps])
        except KafkaError:  # broker unreachable right now: not known to be at the end
            return False
        return all(self.raw.position(_tp(tp)) >= ends[_tp(tp)] for tp in tps)

    def keepalive(self) -> None:
        self.raw.poll(timeout_ms=0)  # paused: fetches nothing, keeps the member alive

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        from kafka.errors import TopicAuthorizationFailedError, UnknownTopicOrPartitionError

        out = {}
        for topic in topics:
            try:
                out[topic] = len(self.raw.partitions_for_topic(topic))
            except (UnknownTopicOrPartitionError, TopicAuthorizationFailedError):
                out[topic] = 0
        return out

    def rejoin(self) -> None:
        """A static member (``group_instance_id``) that rejoins is handed the assignment the group
        already had, empty if its topics did not exist when it was made, and kafka-python
        recomputes an assignment only in the member that made it: without a new join it would
        hold nothing for as long as the group lives. A requested rejoin makes the group assign
        again (verified on Kafka 4)."""
        self.raw._coordinator.request_rejoin()

    def close(self) -> None:
        self.raw.close(autocommit=False)


def _tp(tp: TP) -> Any:
    from kafka.structs import TopicPartition

    return tp if isinstance(tp, TopicPartition) else TopicPartition(*tp)


def _offsets(offsets: Mapping[TP, int]) -> dict[Any, Any]:
    from kafka.structs import OffsetAndMetadata

    return {_tp(tp): OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()}


def _origin(topic: str, partition: int, record: Any) -> dict[str, Any]:
    """Where a record came from, with its message key (bytes or None): the privacy key of
    ``privacy.unit: key`` unless ``privacy.key_field`` names a JSON field (privacy rule 12)."""
    return {"topic": topic, "partition": partition, "offset": record.offset, "timestamp": record.timestamp,
            "key": record.key}


class KafkaPythonProducer:
    """kafka-python's ``KafkaProducer`` behind :class:`ProducerClient`; a handle is a send future."""

    def __init__(self, connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> None:
        from kafka import KafkaProducer

        self.raw = KafkaProducer(**connection.client_options(client_id), **settings)

    def init_transactions(self) -> None:
        self.raw.init_transactions()

    def begin(self) -> None:
        self.raw.begin_transaction()

    def send(self, topic: str, value: bytes, key: bytes | None = None,
             headers: Sequence[tuple[str, bytes]] | None = None, partition: int | None = None) -> Any:
        return self.raw.send(topic, value=value, key=key, headers=list(headers or []), partition=partition)

    def confirm(self, handles: Sequence[Any], timeout_s: float, what: str) -> None:
        self.raw.flush(timeout=timeout_s)
        for i, future in enumerate(handles):
            _check_future(future, timeout_s, part_label(what, i, len(handles)))

    def flush(self, timeout_s: float) -> None:
        self.raw.flush(timeout=timeout_s)

    def commit(self) -> None:
        self.raw.commit_transaction()

    def abort(self) -> None:
        self.raw.abort_transaction()

    def partitions(self, topic: str) -> int:
        return len(self.raw.partitions_for(topic) or [])

    def close(self, timeout_s: float) -> None:
        self.raw.close(timeout=timeout_s)


def _check_future(future: Any, timeout_s: float, what: str) -> Any:
    """The result of a send ``future``; :class:`KafkaPublishError` naming ``what`` if it failed."""
    try:
        return future.get(timeout=timeout_s)
    except Exception as exc:
        raise KafkaPublishError(f"{what} was not acknowledged: {type(exc).__name__}: {exc}") from exc
