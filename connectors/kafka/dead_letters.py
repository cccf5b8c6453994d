"""Kafka dead-letter sink: :class:`KafkaDeadLetterSink` puts rejected records on a topic with
their original bytes as the value and the reason, detail and source topic/partition/offset in
headers; :func:`dead_letter_from_record` reads one back."""

from __future__ import annotations

from typing import Any, Sequence

from connectors.kafka.admin import ensure_topic
from connectors.kafka.clients import producer_client
from connectors.kafka.connection import KafkaConnection, takes_connection
from stream_vips.io import DeadLetter


class KafkaDeadLetterSink:
    """Rejected records on a dead-letter topic.

    Value: the original bytes, or their first ``runtime.dead_letter_max_bytes`` (the pipeline
    bounds every letter, so a send never fails for size). Key: ``<topic>/<partition>/<offset>``
    of the source record when known. Headers: ``reason``, ``detail``, ``length`` and ``sha256``
    of the original value, ``truncated``, ``source.topic``, ``source.partition``,
    ``source.offset`` (and any other origin field as ``source.<name>``). Sends are asynchronous;
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
        ensure_topic(connection.servers, topic, partitions=partitions, replication_factor=replication_factor,
                     create=create_topic, security=connection.security)
        self._producer = producer_client(connection, client_id or connection.client_id("dead-letters"), dict(
            acks="all", enable_idempotence=True, compression_type="zstd", linger_ms=5))
        self._pending: list[Any] = []

    def send(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            origin = dict(letter.record.origin)
            headers = [("reason", letter.reason.encode()), ("detail", letter.detail.encode("utf-8", "replace"))]
            if letter.length is not None:
                headers += [("length", str(letter.length).encode()), ("sha256", str(letter.sha256).encode()),
                            ("truncated", b"true" if letter.truncated else b"false")]
            headers += [(f"source.{k}", v if isinstance(v, bytes) else str(v).encode())
                        for k, v in origin.items() if v is not None]
            key = None
            if {"topic", "partition", "offset"} <= set(origin):
                key = f"{origin['topic']}/{origin['partition']}/{origin['offset']}".encode()
            self._pending.append(self._producer.send(self.topic, letter.record.value, key, headers))
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

