"""A dead letter's Kafka record stays under the producer's request limit whatever the rejected
record carried (a 2 MB message key used to give a letter over 1 MiB: kafka-python refused it
synchronously in send(), the run stopped, and the restart read the same record again). No broker:
the size is kafka-python's own estimate, the one ``KafkaProducer.send`` checks."""

from __future__ import annotations

import hashlib
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder

from connectors.kafka.dead_letters import (
    MAX_REQUEST_BYTES,
    SIZE_MARGIN,
    KafkaDeadLetterSink,
    dead_letter_from_record,
    fitted,
)
from stream_vips.io import DeadLetter, RawRecord


class _Producer:
    """Keeps what the sink sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]] = []

    def send(self, topic: str, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> int:
        self.sent.append((topic, value, key, headers))
        return len(self.sent)


class _Record:
    def __init__(self, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self.value, self.headers = value, headers


def _sink() -> tuple[KafkaDeadLetterSink, _Producer]:
    """The sink without its broker connection (topic creation and a real producer)."""
    sink = object.__new__(KafkaDeadLetterSink)
    sink.topic, sink.send_timeout_s, sink._pending = "dlq", 30.0, []
    sink._producer = producer = _Producer()
    return sink, producer


def _size(value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)


def test_a_2mb_key_and_value_give_a_letter_under_the_request_limit_that_identifies_both():
    key, value = b"k" * 2_000_000, b"{" * 2_000_000
    origin: dict[str, Any] = {"topic": "records", "partition": 3, "offset": 123, "timestamp": 1, "key": key}
    sink, producer = _sink()
    for cap in (65_536, 900_000):  # the default and the largest runtime.dead_letter_max_bytes
        sink.send([DeadLetter.bounded(RawRecord(value, origin), "invalid_json", "Expecting value", cap)])
        topic, sent_value, sent_key, headers = producer.sent[-1]
        assert _size(sent_value, sent_key, headers) <= MAX_REQUEST_BYTES - SIZE_MARGIN
        assert sent_value == value[:cap] and sent_key == b"records/3/123"
        back = dead_letter_from_record(_Record(sent_value, headers))
        assert (back["length"], back["sha256"], back["truncated"]) == (
            len(value), hashlib.sha256(value).hexdigest(), True)
        assert back["source"]["key"] == "k" * 1024 and back["source"]["key.length"] == str(len(key))
        assert back["source"]["key.sha256"] == hashlib.sha256(key).hexdigest()


def test_headers_past_the_budget_cut_the_value_then_keep_only_the_position():
    """A source with many large origin fields: each is bounded, but together they can pass the
    budget. The value is cut first, still described by length and sha256; headers alone over the
    budget leave only topic, partition and offset of the origin."""
    value = b"v" * 900_000
    origin: dict[str, Any] = {"topic": "t", "partition": 0, "offset": 1, **{f"f{i}": "x" * 5000 for i in range(200)}}
    letter = DeadLetter.bounded(RawRecord(value, origin), "invalid_json", "d", 900_000)
    value_out, key, headers = fitted(letter)
    assert _size(value_out, key, headers) <= MAX_REQUEST_BYTES - SIZE_MARGIN
    assert 0 < len(value_out) < len(value) and dict(headers)["truncated"] == b"true"
    assert dict(headers)["sha256"] == hashlib.sha256(value).hexdigest().encode()
    value_out, key, headers = fitted(letter, budget=50_000)
    names = [name for name, _ in headers]
    assert _size(value_out, key, headers) <= 50_000 and value_out == b""
    assert names == ["reason", "detail", "length", "sha256", "truncated", "source.topic", "source.partition",
                     "source.offset"]
    # a letter within the budget goes out unchanged
    small = DeadLetter.bounded(RawRecord(b"{", {"topic": "t", "partition": 0, "offset": 1}), "invalid_json", "d", 10)
    assert fitted(small) == (b"{", b"t/0/1", [("reason", b"invalid_json"), ("detail", b"d"), ("length", b"1"),
                                             ("sha256", hashlib.sha256(b"{").hexdigest().encode()),
                                             ("truncated", b"false"), ("source.topic", b"t"),
                                             ("source.partition", b"0"), ("source.offset", b"1")])
