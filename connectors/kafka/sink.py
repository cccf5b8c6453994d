"""Kafka model sink: :class:`KafkaModelSink` publishes model messages as JSON on a compacted
topic keyed by model id, compressed by the producer (zstd, the ``zstandard`` package).

A message larger than the topic's ``max.message.bytes`` is split into chunks sent in one
transaction, so a ``read_committed`` reader sees all chunks or none (:class:`Reassembler` puts
them together). Every send future is checked: a failure raises :class:`KafkaPublishError`.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.kafka.access import Grant, denial, discard_producer, grant_for
from connectors.kafka.admin import read_topic
from connectors.kafka.clients import producer_client
from connectors.kafka.connection import KafkaConnection, log, takes_connection
from connectors.kafka.errors import KafkaConnectorError, KafkaPublishError, retriable
from connectors.kafka.topics import TopicSpec

#: Headers of a chunked model message (all chunks of one message share ``message_id``).
CHUNK_HEADER = "stream-vips-chunk"  # "<index>/<count>"
MESSAGE_ID_HEADER = "stream-vips-message-id"
SHA256_HEADER = "stream-vips-sha256"  # of the whole reassembled payload, on every chunk
#: Bytes reserved per record for key, headers and batch framing when chunking.
RECORD_OVERHEAD = 4096
#: A sink given no ``transactional_id`` takes a random one under this prefix.
TRANSACTIONAL_PREFIX = "stream-vips-models-"


def _partition_for(key: bytes, partitions: int) -> int:
    from kafka.partitioner.default import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions


def chunk_payload(payload: bytes, max_bytes: int) -> list[bytes]:
    """Split ``payload`` into pieces of at most ``max_bytes`` (one piece when it fits)."""
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    return [payload[i:i + max_bytes] for i in range(0, max(len(payload), 1), max_bytes)]


class KafkaModelSink:
    """Publishes model messages to a compacted topic keyed by model id.

    The topic is created (or checked) with ``cleanup.policy=compact`` and ``max_message_bytes``.
    A payload is chunked when its size would exceed ``max_message_bytes`` minus a framing
    reserve; the chunks go out in one transaction with headers ``stream-vips-chunk: i/n``,
    ``stream-vips-message-id`` and ``stream-vips-sha256``. Earlier chunks are keyed
    ``<model id>#chunk-<i>`` and the last one carries the model id key, so compaction keeps the
    latest complete message per model id and a plain reader of the key sees where it ends.
    A transient failure (a broker restarting) is retried, as a new transaction, for
    ``publish_timeout_s``; after that, or on a permanent error, :class:`KafkaPublishError`.
    Connection settings come flat or as one ``connection``; the client id defaults to
    ``<prefix>-model-sink``.
    """

    @takes_connection
    def __init__(
        self,
        topic: str = "stream-vips-models",
        create_topic: bool = True,
        partitions: int = 1,
        replication_factor: int = 1,
        max_message_bytes: int = 1_048_576,
        compression: str = "zstd",
        transactional_id: str | None = None,
        send_timeout_s: float = 30.0,
        publish_timeout_s: float = 120.0,
        client_id: str | None = None,
        *,
        connection: KafkaConnection,
    ) -> None:
        if compression not in ("zstd", "lz4", "gzip", "snappy", "none"):
            raise KafkaConnectorError(f"compression must be zstd, lz4, gzip, snappy or none, got {compression!r}")
        if max_message_bytes <= 2 * RECORD_OVERHEAD:
            raise KafkaConnectorError(f"max_message_bytes must exceed {2 * RECORD_OVERHEAD}")
        self.topic = topic
        self.max_message_bytes = int(max_message_bytes)
        self.chunk_bytes = self.max_message_bytes - RECORD_OVERHEAD
        self.send_timeout_s = float(send_timeout_s)
        self.publish_timeout_s = float(publish_timeout_s)
        self._grants = self.grants(topic, transactional_id, create_topic)
        self.topic_spec(topic, partitions, replication_factor, max_message_bytes).ensure(
            connection.servers, connection.security, create_topic, self._grants)
        self._client_id = client_id or connection.client_id("model-sink")
        self._producer_options = dict(
            acks="all", enable_idempotence=True,
            transactional_id=transactional_id or f"{TRANSACTIONAL_PREFIX}{uuid.uuid4().hex}",
            compression_type=None if compression == "none" else compression,
            max_request_size=self.max_message_bytes, linger_ms=0,
        )
        self._connection = connection
        self._producer = self._new_producer()
        self._partitions = self._producer.partitions(topic) or partitions
        self.chunked_messages = 0

    @staticmethod
    def topic_spec(topic: str, partitions: int, replication_factor: int, max_message_bytes: int) -> TopicSpec:
        """The model topic: compacted (the latest message per model id is kept for good) and
        taking records of ``max_message_bytes``."""
        return TopicSpec(topic, "model topic", partitions, replication_factor,
                         {"cleanup.policy": "compact", "max.message.bytes": str(int(max_message_bytes))},
                         risk="a lost broker disk loses the published models: readers have none until the next "
                              "release, and a restart cannot check the last release against the ledger")

    @staticmethod
    def grants(topic: str = "stream-vips-models", transactional_id: str | None = None,
               create_topic: bool = True) -> list[Grant]:
        """The ACLs the sink needs (checked at start; :mod:`connectors.kafka.access`)."""
        out = [Grant("topic", topic, "Write", "the model sink publishes each model in a transaction",
                     "connectors.kafka.sink.KafkaModelSink.publish"),
               Grant("topic", topic, "Read", "the model sink reads the latest model back at start",
                     "connectors.kafka.sink.KafkaModelSink.latest via "
                     "stream_vips.service.app.Application.check_published"),
               Grant("topic", topic, "DescribeConfigs", "the model sink checks cleanup.policy, max.message.bytes "
                     "and min.insync.replicas at start", "connectors.kafka.admin.ensure_topic"),
               Grant("transactionalId", transactional_id or TRANSACTIONAL_PREFIX, "Write",
                     "the model sink writes in transactions under a fixed id",
                     "connectors.kafka.sink.KafkaModelSink._new_producer and ._send_transaction",
                     pattern="literal" if transactional_id else "prefix")]
        if create_topic:
            out.append(Grant("topic", topic, "Create", "the model sink creates the topic when it is missing "
                             "and create_topic is true", "connectors.kafka.admin.ensure_topic"))
        return out

    def publish(self, key: str, message: Mapping[str, Any]) -> None:
        payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
        key_b = key.encode("utf-8")
        partition = _partition_for(key_b, self._partitions)
        pieces = chunk_payload(payload, self.chunk_bytes)
        headers: list[tuple[str, bytes]] = []
        if len(pieces) > 1:
            self.chunked_messages += 1
            headers = [(MESSAGE_ID_HEADER, uuid.uuid4().hex.encode()),
                       (SHA256_HEADER, hashlib.sha256(payload).hexdigest().encode())]
        records = []
        for i, piece in enumerate(pieces):
            h = headers + [(CHUNK_HEADER, f"{i}/{len(pieces)}".encode())] if headers else []
            k = key_b if i == len(pieces) - 1 else key_b + f"#chunk-{i}".encode()
            records.append((k, piece, h))
        what = f"model {key!r} version {message.get('version')}"
        deadline = time.monotonic() + self.publish_timeout_s
        while True:
            try:
                self._send_transaction(records, partition, what)
                return
            except KafkaPublishError as exc:
                if not retriable(exc) or time.monotonic() >= deadline:
                    raise
                log.warning("%s: %s; retrying", what, exc)
                time.sleep(0.5)

    def _new_producer(self) -> Any:
        producer = producer_client(self._connection, self._client_id, self._producer_options)
        try:
            producer.init_transactions()
        except Exception as exc:
            denied = denial(exc, self._connection.security, grant_for(self._grants, "transactionalId", "Write"))
            if denied is None:
                raise
            discard_producer(producer)
            raise denied from None
        return producer

    def _send_transaction(self, records: list[tuple[bytes, bytes, list]], partition: int, what: str) -> None:
        """All records of one message in one transaction; aborted (or the producer replaced,
        which fences and aborts) on failure."""
        try:
            self._producer.begin()
            handles = [self._producer.send(self.topic, v, k, h, partition) for k, v, h in records]
            self._producer.confirm(handles, self.send_timeout_s, what)
            self._producer.commit()
        except Exception as exc:
            try:
                self._producer.abort()
            except Exception as abort_exc:
                log.warning("aborting the model transaction failed (%s): starting a new producer", abort_exc)
                self._producer.close(0)
                self._producer = self._new_producer()
            if isinstance(exc, KafkaPublishError):
                raise
            raise KafkaPublishError(f"{what} was not published: {type(exc).__name__}: {exc}") from exc

    def flush(self) -> None:
        self._producer.flush(self.send_timeout_s)

    def latest(self, key: str) -> dict[str, Any] | None:
        """The last committed message for ``key`` on the topic (reassembled), or ``None``."""
        found = None
        assembler = Reassembler()
        for rec in read_topic(self._connection.servers, self.topic, security=self._connection.security,
                              timeout_s=self.publish_timeout_s, why=grant_for(self._grants, "topic", "Read").why):
            whole = assembler.add(rec.key, rec.value, rec.headers)
            if whole is not None and whole[0] == key:
                found = whole[1]
        return None if found is None else json.loads(found)

    def close(self) -> None:
        self._producer.close(self.send_timeout_s)


def chunk_info(headers: Sequence[tuple[str, bytes]] | None) -> tuple[int, int, str, str] | None:
    """``(index, count, message_id, sha256)`` of a chunk record, ``None`` for a whole message."""
    h = dict(headers or [])
    if CHUNK_HEADER not in h:
        return None
    index, _, count = h[CHUNK_HEADER].decode().partition("/")
    return int(index), int(count), h[MESSAGE_ID_HEADER].decode(), h[SHA256_HEADER].decode()


class Reassembler:
    """Turns model-topic records (in partition order) back into whole payloads.

    ``add(key, value, headers)`` returns ``(model_id, payload)`` when a message is complete and
    ``None`` for a non-final chunk. A final chunk whose pieces are missing or whose checksum
    fails raises :class:`KafkaConnectorError`.
    """

    def __init__(self) -> None:
        self._parts: dict[str, dict[int, bytes]] = {}

    def add(self, key: bytes | None, value: bytes | None,
            headers: Sequence[tuple[str, bytes]] | None) -> tuple[str, bytes] | None:
        info = chunk_info(headers)
        key_s = (key or b"").decode("utf-8")
        if info is None:
            return (key_s, value) if value is not None else None
        index, count, message_id, digest = info
        parts = self._parts.setdefault(message_id, {})
        parts[index] = value or b""
        if index != count - 1:
            return None
        del self._parts[message_id]
        if len(parts) != count:
            raise KafkaConnectorError(f"model {key_s!r}: {count - len(parts)} of {count} chunks missing")
        payload = b"".join(parts[i] for i in range(count))
        if hashlib.sha256(payload).hexdigest() != digest:
            raise KafkaConnectorError(f"model {key_s!r}: reassembled payload fails its sha256")
        return key_s, payload

