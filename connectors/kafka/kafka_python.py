"""kafka-python behind the connectors' client seam (:mod:`connectors.kafka.clients`), the default
client library of a Kafka connection (``client: kafka-python``): the consumer, the producer, and
the rebalance listener (:class:`SeekListener`) through which kafka-python calls the source's hooks.

Like :mod:`connectors.kafka.confluent`, this side depends only on the modules below the seam
(the connection, the errors, the rebalance hooks); the seam picks it by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from operator import attrgetter
from typing import Any

from connectors.kafka.connection import KafkaConnection, log
from connectors.kafka.errors import CommitRefused, KafkaPublishError, part_label
from connectors.kafka.rebalance import TP, Rebalance, partitions_lost


class KafkaPythonConsumer:
    """kafka-python's ``KafkaConsumer`` behind :class:`~connectors.kafka.clients.ConsumerClient`."""

    offset_of = attrgetter("offset")
    value_of = attrgetter("value")

    def __init__(self, connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> None:
        from kafka import KafkaConsumer

        self.raw = KafkaConsumer(**connection.client_options(client_id), **settings)

    def subscribe(self, topics: list[str], hooks: Rebalance) -> None:
        self.raw.subscribe(topics, listener=SeekListener(hooks, self))

    def assign(self, tps: list[TP], hooks: Rebalance) -> None:
        self.raw.assign([_tp(tp) for tp in tps])

    def fetch(self, max_records: int, timeout_s: float) -> list[tuple[TP, list]]:
        return list(self.raw.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records).items())

    def origin(self, topic: str, partition: int) -> Callable[[Any], dict[str, Any]]:
        return partial(record_origin, topic, partition)

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


def record_origin(topic: str, partition: int, record: Any) -> dict[str, Any]:
    """Where a record came from, with its message key (bytes or None): the privacy key of
    ``privacy.unit: key`` unless ``privacy.key_field`` names a JSON field (privacy rule 12)."""
    return {"topic": topic, "partition": partition, "offset": record.offset, "timestamp": record.timestamp,
            "key": record.key}


class KafkaPythonProducer:
    """kafka-python's ``KafkaProducer`` behind :class:`~connectors.kafka.clients.ProducerClient`; a handle is a send
    future."""

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


def _listener_base() -> type:
    from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener

    return AsyncConsumerRebalanceListener


class SeekListener(_listener_base()):
    """kafka-python's rebalance listener over the source's :class:`Rebalance` hooks: commits
    processed offsets before partitions are revoked, applies
    :meth:`~connectors.kafka.source.KafkaSource.seek` offsets when partitions are assigned, keeps
    pauses. ``client`` is the :class:`KafkaPythonConsumer` that subscribed with it.

    kafka-python 3 runs rebalance listeners on the consumer's IO thread, where the blocking
    ``commit()`` refuses to run, so the listener is the async kind and awaits the commit
    (:meth:`KafkaPythonConsumer.commit_in_callback`).
    """

    def __init__(self, hooks: Rebalance, client: KafkaPythonConsumer) -> None:
        self.hooks = hooks
        self.client = client

    async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
        from kafka.errors import CommitFailedError, KafkaError

        hooks = self.hooks
        offsets = hooks.revoking(set(revoked))
        if not offsets:
            return
        try:
            await self.client.commit_in_callback(offsets, hooks.commit_timeout_ms / 1000)
        except (CommitFailedError, KafkaError) as exc:
            log.warning("offset commit before revocation failed (records may be consumed twice): %s", exc)
            return
        hooks.revoke_committed(offsets)

    async def on_partitions_lost(self, lost: Iterable[Any]) -> None:
        partitions_lost(lost)

    async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
        hooks = self.hooks
        assigned = set(assigned)
        for tp, offset in hooks.assigned(assigned).items():
            self.client.raw.seek(tp, offset)
        if hooks.halted:
            self.client.raw.pause(*assigned)
