"""Kafka dead-letter sink: :class:`KafkaDeadLetterSink` puts rejected records on a topic with
their original bytes as the value and the reason, detail and source topic/partition/offset in
headers; :func:`dead_letter_from_record` reads one back."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder

from connectors.kafka.access import Grant
from connectors.kafka.clients import producer_client
from connectors.kafka.connection import KafkaConnection, server_list, takes_connection
from connectors.kafka.errors import KafkaConnectorError
from connectors.kafka.topics import TopicSpec
from stream_vips.io import DeadLetter

#: The dead-letter producer's request limit, set on both client libraries so that they refuse at
#: the same size: kafka-python's default ``max_request_size`` (librdkafka's ``message.max.bytes``
#: would otherwise be 1,000,000).
MAX_REQUEST_BYTES = 1 << 20
#: Room kept under MAX_REQUEST_BYTES beyond kafka-python's own size estimate. That estimate
#: (``DefaultRecordBatchBuilder.estimate_size_in_bytes``, what ``send()`` checks) already counts
#: the 61-byte batch header, at most 21 bytes of record framing (length, attributes, timestamp
#: and offset deltas as varints) and every key, value and header with its varint length;
#: librdkafka's check counts the same record without the batch header. What it leaves out is
#: zstd's growth of incompressible bytes, 3 bytes per 128 KiB block plus an 18-byte frame
#: header (under 50 bytes at 1 MiB), while the broker's default ``max.message.bytes`` is only 12
#: bytes above 1 MiB: 1 KiB covers that with room to spare.
SIZE_MARGIN = 1024
_BUDGET = MAX_REQUEST_BYTES - SIZE_MARGIN
#: Origin fields kept when a letter's headers alone would pass the budget (they are in the key too).
_POSITION = ("topic", "partition", "offset")


def fitted(letter: DeadLetter, budget: int = _BUDGET) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """``(value, key, headers)`` of ``letter``'s Kafka record, at most ``budget`` bytes by
    kafka-python's estimate of a one-record batch (see ``SIZE_MARGIN``), so a send never fails
    for size. :meth:`DeadLetter.bounded` keeps letters well inside; past the budget (a source
    with many large origin fields) the value is cut further, and if the headers alone pass it
    only the record's position stays of its origin. A letter without a value (a tombstone) is
    a record without one too; it then always has a key (empty when the origin has no position),
    since a Kafka record needs a key or a value.

    >>> from stream_vips.io import RawRecord
    >>> value, key, headers = fitted(DeadLetter.bounded(RawRecord(b"v" * 5000, {"topic": "t", "partition": 0,
    ...     "offset": 9, "note": "n" * 1000}), "invalid_json", "bad", 5000), budget=4000)
    >>> key, len(value) < 5000, dict(headers)["truncated"], dict(headers)["length"]
    (b't/0/9', True, b'true', b'5000')
    """
    origin = letter.record.origin
    key = None
    if {"topic", "partition", "offset"} <= set(origin):
        key = f"{origin['topic']}/{origin['partition']}/{origin['offset']}".encode()
    elif letter.record.value is None:
        key = b""
    source = [(f"source.{k}", v if isinstance(v, bytes) else str(v).encode("utf-8", "replace"))
              for k, v in origin.items() if v is not None]
    headers = _headers(letter) + source
    excess = _size(key, letter.record.value, headers) - budget
    if excess > 0:  # the cut may add length, sha256 and truncated headers: ~100 bytes, 128 kept free
        cut = letter.shortened(max(0, len(letter.record.value or b"") - excess - 128))
        headers = _headers(cut) + source
        if _size(key, cut.record.value, headers) > budget:
            headers = _headers(cut) + [h for h in source if h[0][len("source."):] in _POSITION]
        letter = cut
    return letter.record.value, key, headers


def _headers(letter: DeadLetter) -> list[tuple[str, bytes]]:
    """A letter's own headers: reason, detail and (when known) the original value's description."""
    headers = [("reason", letter.reason.encode()), ("detail", letter.detail.encode("utf-8", "replace"))]
    if letter.length is not None:
        headers += [("length", str(letter.length).encode()), ("sha256", str(letter.sha256).encode()),
                    ("truncated", b"true" if letter.truncated else b"false")]
    return headers


def _size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)


class KafkaDeadLetterSink:
    """Rejected records on a dead-letter topic.

    Value: the original bytes, or their first ``runtime.dead_letter_max_bytes``. Key:
    ``<topic>/<partition>/<offset>`` of the source record when known. Headers: ``reason``,
    ``detail``, ``length`` and ``sha256`` of the original value, ``truncated``, ``source.topic``,
    ``source.partition``, ``source.offset`` (and any other origin field as ``source.<name>``,
    e.g. the message key as ``source.key``: cut to 1 KiB by the pipeline, with
    ``source.key.length`` and ``source.key.sha256`` then). The pipeline bounds every letter and
    :func:`fitted` keeps each record under the producer's request limit, so a send never fails
    for size. Sends are asynchronous;
    :meth:`flush` confirms them all, and the pipeline calls it before committing any offset.
    Connection settings come flat or as one ``connection``; the client id defaults to
    ``<prefix>-dead-letters``.
    """

    @takes_connection
    def __init__(
        self,
        topic: str = "stream-vips-dead-letters",
        create_topic: bool = True,
        partitions: int = 1,
        replication_factor: int = 1,
        send_timeout_s: float = 30.0,
        client_id: str | None = None,
        *,
        connection: KafkaConnection,
    ) -> None:
        self.topic = topic
        self.send_timeout_s = float(send_timeout_s)
        self.topic_spec(topic, partitions, replication_factor).ensure(connection.servers, connection.security,
                                                                     create_topic, self.grants(topic, create_topic))
        self._producer = producer_client(connection, client_id or connection.client_id("dead-letters"), dict(
            acks="all", enable_idempotence=True, compression_type="zstd", linger_ms=5,
            max_request_size=MAX_REQUEST_BYTES))
        self._pending: list[Any] = []

    @staticmethod
    def topic_spec(topic: str, partitions: int, replication_factor: int) -> TopicSpec:
        """The dead-letter topic: no settings required (retention is the operator's choice)."""
        return TopicSpec(topic, "dead letters", partitions, replication_factor,
                         risk="a lost broker disk loses the rejected records not yet read")

    @staticmethod
    def grants(topic: str = "stream-vips-dead-letters", create_topic: bool = True) -> list[Grant]:
        """The ACLs the dead-letter sink needs (checked at start; :mod:`connectors.kafka.access`)."""
        out = [Grant("topic", topic, "Write", "the dead-letter sink sends rejected records",
                     "connectors.kafka.dead_letters.KafkaDeadLetterSink.send"),
               Grant("topic", topic, "DescribeConfigs", "the dead-letter sink checks min.insync.replicas against "
                     "the replicas at start", "connectors.kafka.admin.ensure_topic")]
        if create_topic:
            out.append(Grant("topic", topic, "Create", "the dead-letter sink creates the topic when it is missing "
                             "and create_topic is true", "connectors.kafka.admin.ensure_topic"))
        return out

    def send(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            self._pending.append(self._producer.send(self.topic, *fitted(letter)))
        if len(self._pending) > 10_000:
            self.flush()

    def flush(self) -> None:
        """Wait for every letter sent so far; :class:`KafkaPublishError` if one was refused (the
        pipeline then stops without committing the source past it)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        self._producer.confirm(pending, self.send_timeout_s, f"dead letters to {self.topic!r}")

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._producer.close(self.send_timeout_s)


def dead_letter_from_record(record: Any) -> dict[str, Any]:
    """Decode a dead-letter topic record: value bytes, reason, detail and source fields."""
    h = {k: v.decode("utf-8", "replace") for k, v in (record.headers or [])}
    source = {k[len("source."):]: v for k, v in h.items() if k.startswith("source.")}
    out = {"value": record.value, "reason": h.get("reason"), "detail": h.get("detail"), "source": source}
    if "length" in h:
        out.update(length=int(h["length"]), sha256=h.get("sha256"), truncated=h.get("truncated") == "true")
    return out



def dead_letter_reasons(bootstrap_servers: str | Sequence[str], topic: str, *,
                        security: Mapping[str, Any] | None = None, timeout_s: float = 30.0) -> Counter:
    """Letters per ``reason`` header on a dead-letter topic, from its start to the end it had
    when the count began (``stream-vips report --dead-letter-topic``). Records are counted as
    they arrive and not kept, so a topic of any length fits in memory; ``timeout_s`` bounds a
    stall (no record for that long), not the whole count."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=server_list(bootstrap_servers), group_id=None, enable_auto_commit=False,
                             **dict(security or {}))
    counts: Counter = Counter()
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise KafkaConnectorError(f"dead-letter topic {topic!r} does not exist (or this user may not describe it)")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise KafkaConnectorError(f"reading dead-letter topic {topic!r} stalled: no record for {timeout_s}s")
            for recs in consumer.poll(timeout_ms=500).values():
                for rec in recs:
                    reason = dict(rec.headers or []).get("reason")
                    counts[reason.decode("utf-8", "replace") if reason else "(unreadable)"] += 1
                deadline = time.monotonic() + timeout_s
    finally:
        consumer.close(autocommit=False)
    return counts
