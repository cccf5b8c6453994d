"""confluent-kafka (librdkafka) behind the connectors' client seam (:mod:`connectors.kafka.clients`),
chosen with ``client: confluent`` on a Kafka connection.

The connectors' rules are shared with kafka-python; only the library calls differ:

* settings keep their kafka-python names in the connectors and are renamed here to librdkafka's
  (:func:`librdkafka_config`), security included (``sasl_username`` -> ``sasl.username``,
  ``ssl_cafile`` -> ``ssl.ca.location``, ...);
* rebalance callbacks run inside ``consume()`` on the calling thread (the source's ``poll()``
  or its keep-alive), where a synchronous commit is allowed: the revocation commits directly;
  checkpoint offsets are applied by assigning the partitions at them;
* librdkafka logs through the ``kafka.librdkafka`` logger, inside the ``kafka`` hierarchy that
  :func:`stream_vips.logsafety.guard_client_logging` floors (WARNING; INFO when the run logs at
  DEBUG) and filters, and at
  ``log_level`` 6 (no debug contexts are ever set, so no protocol dumps are produced);
* a send's handle is a delivery report filled in by ``flush()``.

Example (no broker needed)::

    >>> from connectors.kafka.connection import KafkaConnection
    >>> c = KafkaConnection("b1:9092,b2:9092", security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
    ...                     sasl_username="u", sasl_password="p", ssl_cafile="/ca.pem", client="confluent")
    >>> conf = librdkafka_config(c, "x", {"group_id": "g", "group_instance_id": None}, CONSUMER_NAMES)
    >>> {k: conf[k] for k in ("bootstrap.servers", "group.id", "sasl.username", "ssl.ca.location")}
    {'bootstrap.servers': 'b1:9092,b2:9092', 'group.id': 'g', 'sasl.username': 'u', 'ssl.ca.location': '/ca.pem'}
    >>> "group.instance.id" in conf, "debug" in conf
    (False, False)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import groupby
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from connectors.kafka.connection import KafkaConnection, log
from connectors.kafka.errors import CommitRefused, KafkaPublishError, part_label
from connectors.kafka.rebalance import Rebalance, partitions_lost
from stream_vips.logsafety import CLIENT_LOGGER, guard_client_logging

#: librdkafka's log lines go here: inside the client hierarchy that the log-safety guard covers.
LIBRDKAFKA_LOGGER = logging.getLogger(f"{CLIENT_LOGGER}.librdkafka")
guard_client_logging()  # the logger above exists now, so it gets the floor and the filter

#: kafka-python security keyword -> librdkafka property.
SECURITY_NAMES = {"security_protocol": "security.protocol", "sasl_mechanism": "sasl.mechanism",
                  "sasl_plain_username": "sasl.username", "sasl_plain_password": "sasl.password",
                  "ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location",
                  "ssl_keyfile": "ssl.key.location", "ssl_password": "ssl.key.password"}
#: The consumer settings the source uses, kafka-python name -> librdkafka property.
CONSUMER_NAMES = {"group_id": "group.id", "group_instance_id": "group.instance.id",
                  "enable_auto_commit": "enable.auto.commit", "auto_offset_reset": "auto.offset.reset",
                  "isolation_level": "isolation.level", "session_timeout_ms": "session.timeout.ms",
                  "max_poll_interval_ms": "max.poll.interval.ms", "heartbeat_interval_ms": "heartbeat.interval.ms",
                  "fetch_max_bytes": "fetch.max.bytes", "max_partition_fetch_bytes": "max.partition.fetch.bytes"}
#: The producer settings the sinks and the ledger use.
PRODUCER_NAMES = {"acks": "acks", "enable_idempotence": "enable.idempotence", "transactional_id": "transactional.id",
                  "compression_type": "compression.type", "max_request_size": "message.max.bytes",
                  "linger_ms": "linger.ms"}
#: Commit errors that mean the group moved on (the commit is refused, not failed).
_REFUSED = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
            KafkaError._ASSIGNMENT_LOST, KafkaError.FENCED_INSTANCE_ID}
#: The most messages one ``consume()`` call may return (confluent-kafka's limit).
MAX_CONSUME = 1_000_000
#: How long a transaction call (init, commit, abort) may block, like kafka-python's max_block_ms.
TRANSACTION_TIMEOUT_S = 60.0
#: Consumer error events that are the broker refusing access: raised, never retried silently.
_DENIED = {KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED}
#: How long a metadata request of the source's coverage check may wait.
METADATA_TIMEOUT_S = 5.0


def librdkafka_config(connection: KafkaConnection, client_id: str, settings: Mapping[str, Any],
                      names: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka properties for a client: the connection's (servers, security, backoff, the
    guarded logger) plus ``settings`` renamed by ``names`` (unset ``None`` values left out)."""
    conf: dict[str, Any] = {"bootstrap.servers": ",".join(connection.servers), "client.id": client_id,
                            "reconnect.backoff.max.ms": connection.reconnect_backoff_max_ms,
                            "logger": LIBRDKAFKA_LOGGER, "log_level": 6}
    conf.update({SECURITY_NAMES[k]: v for k, v in connection.security.items()})
    conf.update({names[k]: v for k, v in settings.items() if v is not None})
    if conf.get("compression.type") is None and "compression_type" in settings:
        conf["compression.type"] = "none"
    return conf


def _tp(tp: tuple[str, int], offset: int | None = None) -> TopicPartition:
    return TopicPartition(tp[0], tp[1]) if offset is None else TopicPartition(tp[0], tp[1], offset)


def _key(tp: TopicPartition) -> tuple[str, int]:
    return tp.topic, tp.partition


def _topic_partition(message: Message) -> tuple[str, int]:
    return message.topic(), message.partition()


def _origin(topic: str, partition: int) -> Callable[[Message], dict[str, Any]]:
    def origin(m: Message) -> dict[str, Any]:
        """Where a record came from, with its message key (as kafka-python's source gives it)."""
        return {"topic": topic, "partition": partition, "offset": m.offset(), "timestamp": m.timestamp()[1],
                "key": m.key()}

    return origin


class ConfluentConsumer:
    """confluent-kafka's ``Consumer`` behind :class:`~connectors.kafka.clients.ConsumerClient`.

    ``fetch`` is one ``consume()`` grouped into per-partition runs (C-level ``groupby``, no
    Python work per record for one topic). Messages a keep-alive ``consume()`` returns (none
    should: the partitions are paused) are kept for the next fetch, never dropped. The
    assignment is tracked from the rebalance callbacks, the only way it changes here: asking
    librdkafka waits on its main thread, milliseconds per call while it fetches.
    """

    offset_of = staticmethod(Message.offset)
    value_of = staticmethod(Message.value)

    def __init__(self, connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> None:
        self.raw = Consumer(librdkafka_config(connection, client_id, settings, CONSUMER_NAMES))
        self.hooks: Rebalance | None = None
        self._topic: str | None = None
        self._paused: set[tuple[str, int]] = set()
        self._assigned: set[tuple[str, int]] = set()
        self._kept: list[Message] = []

    def subscribe(self, topics: list[str], hooks: Rebalance) -> None:
        self.hooks = hooks
        self._topic = topics[0] if len(topics) == 1 else None
        self.raw.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)

    def assign(self, tps: list[tuple[str, int]], hooks: Rebalance) -> None:
        self.hooks = hooks
        topics = {t for t, _ in tps}
        self._topic = next(iter(topics)) if len(topics) == 1 else None
        self._assigned = {(t, p) for t, p in tps}
        self.raw.assign([_tp((t, p)) for t, p in tps])  # no offset: the group's committed one

    # -- rebalance callbacks: inside consume()/close() on the calling thread ------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assigned = {_key(p) for p in partitions}
        seeks = self.hooks.assigned(assigned)
        consumer.assign([_tp(_key(p), seeks.get(_key(p))) for p in partitions])  # a checkpoint's offsets, once
        self._assigned = assigned
        self._paused.clear()
        if self.hooks.halted:
            self.pause(assigned)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {_key(p) for p in partitions}
        self._kept = [m for m in self._kept if _topic_partition(m) not in revoked]
        self._paused -= revoked
        offsets = self.hooks.revoking(revoked)  # commits only held partitions: still assigned here
        self._assigned = self._assigned - revoked
        if not offsets:
            return
        try:
            self.commit(offsets, 0.0)
        except (CommitRefused, KafkaException) as exc:
            log.warning("offset commit before revocation failed (records may be consumed twice): %s", exc)
            return
        self.hooks.revoke_committed(offsets)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {_key(p) for p in partitions}
        self._kept = [m for m in self._kept if _topic_partition(m) not in lost]
        self._assigned = self._assigned - lost
        partitions_lost(lost)

    # -- the seam ----------------------------------------------------------------------------------

    def fetch(self, max_records: int, timeout_s: float) -> list[tuple[tuple[str, int], list]]:
        if self._kept:
            msgs, self._kept = self._kept[:max_records], self._kept[max_records:]
        else:
            msgs = self.raw.consume(min(max_records, MAX_CONSUME), timeout_s)
        if not msgs:
            return []
        if any(map(Message.error, msgs)):
            msgs = self._without_errors(msgs)
        if self._topic is not None:
            return [((self._topic, p), list(run)) for p, run in groupby(msgs, Message.partition)]
        return [(tp, list(run)) for tp, run in groupby(msgs, _topic_partition)]

    @staticmethod
    def _without_errors(msgs: list[Message]) -> list[Message]:
        """The records of a batch; its error events are raised when fatal or a refused access
        (librdkafka reports a group or topic the user may not read as a non-fatal event and
        retries it for ever), else logged (librdkafka recovers from them by itself)."""
        for m in msgs:
            error = m.error()
            if error is not None and (error.fatal() or error.code() in _DENIED):
                raise KafkaException(error)
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer: %s", error)
        return [m for m in msgs if m.error() is None]

    def origin(self, topic: str, partition: int) -> Callable[[Any], dict[str, Any]]:
        return _origin(topic, partition)

    def assignment(self) -> set[tuple[str, int]]:
        return set(self._assigned)

    def paused(self) -> set[tuple[str, int]]:
        return self._paused & self.assignment()

    def pause(self, tps: Iterable[tuple[str, int]]) -> None:
        tps = set(tps)
        if tps:
            self.raw.pause([_tp(tp) for tp in tps])
            self._paused |= tps

    def resume(self, tps: Iterable[tuple[str, int]]) -> None:
        tps = set(tps)
        if tps:
            self.raw.resume([_tp(tp) for tp in tps])
            self._paused -= tps

    def commit(self, offsets: Mapping[tuple[str, int], int], timeout_s: float) -> None:
        """A synchronous commit (librdkafka bounds it by its own request timeouts, not ``timeout_s``)."""
        try:
            result = self.raw.commit(offsets=[_tp(tp, off) for tp, off in offsets.items()], asynchronous=False)
            failed = [p.error for p in result or () if p.error is not None]
            if failed:
                raise KafkaException(failed[0])
        except KafkaException as exc:
            if exc.args[0].code() in _REFUSED:
                raise CommitRefused(str(exc)) from exc
            raise

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        self.raw.seek(_tp(tp, offset))

    def highwater(self, tp: tuple[str, int]) -> int | None:
        """The high watermark cached from the last fetch response (no request)."""
        high = self.raw.get_watermark_offsets(_tp(tp), cached=True)[1]
        return high if high >= 0 else None

    def at_end(self, tps: set[tuple[str, int]], floors: Mapping[tuple[str, int], int]) -> bool:
        try:
            for tp in tps:
                low, high = self.raw.get_watermark_offsets(_tp(tp), timeout=5.0)
                pos = self.raw.position([_tp(tp)])[0].offset
                if pos < 0:  # nothing consumed here yet: where consumption starts
                    pos = floors.get(tp, self.raw.committed([_tp(tp)], timeout=5.0)[0].offset)
                if max(pos, low) < high:
                    return False
        except KafkaException:  # broker unreachable right now: not known to be at the end
            return False
        return True

    def keepalive(self) -> None:
        self._kept.extend(self.raw.consume(1000, 0))  # paused: fetches nothing, counts as a poll

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        found = self.raw.list_topics(timeout=METADATA_TIMEOUT_S).topics
        return {t: len(found[t].partitions) if t in found and found[t].error is None else 0 for t in topics}

    def rejoin(self) -> None:
        """Nothing to do: librdkafka assigns a static member's new topics by itself (verified on
        Kafka 4 with a topic created between two lives of one static member)."""

    def close(self) -> None:
        self.raw.close()
        self._assigned = set()


class _Delivery:
    """One send's delivery report (the ``on_delivery`` callback, run inside ``flush()``)."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        self.done, self.error = True, error


class ConfluentProducer:
    """confluent-kafka's ``Producer`` behind :class:`~connectors.kafka.clients.ProducerClient`."""

    def __init__(self, connection: KafkaConnection, client_id: str, settings: Mapping[str, Any]) -> None:
        self.raw = Producer(librdkafka_config(connection, client_id, settings, PRODUCER_NAMES))

    def init_transactions(self) -> None:
        self.raw.init_transactions(TRANSACTION_TIMEOUT_S)

    def begin(self) -> None:
        self.raw.begin_transaction()

    def send(self, topic: str, value: bytes, key: bytes | None = None,
             headers: Sequence[tuple[str, bytes]] | None = None, partition: int | None = None) -> _Delivery:
        delivery = _Delivery()
        where = {} if partition is None else {"partition": partition}
        while True:
            try:
                self.raw.produce(topic, value, key, headers=list(headers) if headers else None,
                                 on_delivery=delivery, **where)
                return delivery
            except BufferError:  # the local queue is full: let deliveries drain it
                self.raw.poll(0.1)

    def confirm(self, handles: Sequence[_Delivery], timeout_s: float, what: str) -> None:
        self.raw.flush(timeout_s)
        for i, d in enumerate(handles):
            label = part_label(what, i, len(handles))
            if not d.done:
                raise KafkaPublishError(f"{label} was not acknowledged within {timeout_s}s") from KafkaException(
                    KafkaError(KafkaError._TIMED_OUT))
            if d.error is not None:
                raise KafkaPublishError(f"{label} was not acknowledged: {d.error.str()}") from KafkaException(d.error)

    def flush(self, timeout_s: float) -> None:
        if self.raw.flush(timeout_s):
            raise KafkaPublishError(f"messages still unsent after {timeout_s}s") from KafkaException(
                KafkaError(KafkaError._TIMED_OUT))

    def commit(self) -> None:
        self.raw.commit_transaction(TRANSACTION_TIMEOUT_S)

    def abort(self) -> None:
        self.raw.abort_transaction(TRANSACTION_TIMEOUT_S)

    def partitions(self, topic: str) -> int:
        found = self.raw.list_topics(topic, timeout=10.0).topics.get(topic)
        return len(found.partitions) if found is not None and found.error is None else 0

    def close(self, timeout_s: float) -> None:
        self.raw.flush(timeout_s)
