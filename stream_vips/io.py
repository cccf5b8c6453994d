"""The I/O protocols that connectors implement; the core does no network I/O itself."""

from __future__ import annotations

import hashlib
import operator
import os
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, overload, runtime_checkable


@dataclass(frozen=True)
class RawRecord:
    """One record as it arrived: the original bytes plus where it came from. ``value`` is
    ``None`` for a record that has none (a Kafka tombstone)."""

    value: bytes | None
    origin: Mapping[str, Any] = field(default_factory=dict)  # e.g. topic, partition, offset


class RecordBatch(Sequence[RawRecord]):
    """One poll's records, stored column-wise: the pipeline reads ``values`` only, and a
    :class:`RawRecord` (with its origin) is built on access, e.g. for a dead letter.

    ``segments`` are ``(records, origin)`` pairs: ``records`` are the client's record objects,
    ``value_of`` reads a record's bytes and ``origin(record)`` its origin mapping. Building a
    ``RawRecord`` and an origin dict per record costs about 1 us, as much as the pipeline's
    whole share of a Kafka record's budget.

    >>> batch = RecordBatch([([b"a", b"b"], lambda r: {"part": 0}), ([b"c"], lambda r: {"part": 1})], bytes)
    >>> batch.values, len(batch), batch[2]
    ([b'a', b'b', b'c'], 3, RawRecord(value=b'c', origin={'part': 1}))
    >>> batch.origin_field("part")
    [0, 0, 1]
    """

    def __init__(self, segments: Sequence[tuple[Sequence[Any], Callable[[Any], Mapping[str, Any]]]],
                 value_of: Callable[[Any], bytes]) -> None:
        self._segments = [(list(recs), origin) for recs, origin in segments if len(recs)]
        self._starts: list[int] = []
        self.values: list[bytes] = []
        for recs, _ in self._segments:
            self._starts.append(len(self.values))
            self.values.extend(map(value_of, recs))

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, i: int) -> RawRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[RawRecord]: ...

    def __getitem__(self, i: int | slice) -> RawRecord | list[RawRecord]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("record index out of range")
        seg = bisect_right(self._starts, i) - 1
        recs, origin = self._segments[seg]
        return RawRecord(self.values[i], origin(recs[i - self._starts[seg]]))


    def keep_from(self, floors: Mapping[tuple[Any, Any], int]) -> tuple[RecordBatch, int]:
        """This batch without the records below ``floors[(topic, partition)]`` (offsets already
        delivered), and how many were dropped. Reads only the first origin of each segment
        (offsets increase within one) unless the segment starts below its floor."""
        segments, values, dropped = [], [], 0
        for (recs, origin), start in zip(self._segments, self._starts):
            first = origin(recs[0])
            floor = floors.get((first.get("topic"), first.get("partition")))
            cut = 0
            if floor is not None and first.get("offset", floor) < floor:
                cut = bisect_left([origin(r)["offset"] for r in recs], floor)
                dropped += cut
            if cut < len(recs):
                segments.append((recs[cut:], origin))
                values.append(self.values[start + cut:start + len(recs)])
        if not dropped:
            return self, 0
        batch = RecordBatch([], bytes)
        for (recs, origin), vals in zip(segments, values):
            batch._segments.append((recs, origin))
            batch._starts.append(len(batch.values))
            batch.values.extend(vals)
        return batch, dropped


    def origin_field(self, name: str) -> list[Any]:
        """One origin field (e.g. the Kafka message key) of every record, in order, without
        building a RawRecord per record."""
        return [origin(r).get(name) for recs, origin in self._segments for r in recs]

    def ends(self) -> dict[tuple[Any, Any], int]:
        """``{(topic, partition): last offset + 1}`` over the segments whose origin has offsets."""
        out: dict[tuple[Any, Any], int] = {}
        for recs, origin in self._segments:
            last = origin(recs[-1])
            if "offset" in last:
                key = (last.get("topic"), last.get("partition"))
                out[key] = max(out.get(key, 0), last["offset"] + 1)
        return out


_VALUE = operator.attrgetter("value")


def values_of(raws: Sequence[RawRecord]) -> list[bytes]:
    """The record values of one poll (column-wise when the source returned a :class:`RecordBatch`)."""
    return raws.values if isinstance(raws, RecordBatch) else list(map(_VALUE, raws))


@dataclass(frozen=True)
class DeadLetter:
    """A rejected record: its bytes (at most the first ``max_bytes``, see :meth:`bounded`), a
    reason code and a human-readable detail; ``length`` and ``sha256`` describe the original
    value, so a truncated letter still identifies the record. A record without a value (a
    tombstone) makes a letter without one: value, ``length`` and ``sha256`` are ``None``. An origin field cut by
    :meth:`bounded` (e.g. a huge Kafka key) is described the same way, by the origin fields
    ``<name>.length`` and ``<name>.sha256``."""

    record: RawRecord
    reason: str
    detail: str
    length: int | None = None
    sha256: str | None = None

    @property
    def truncated(self) -> bool:
        value = self.record.value
        return value is not None and self.length is not None and self.length > len(value)

    @classmethod
    def bounded(cls, record: RawRecord, reason: str, detail: str, max_bytes: int,
                max_detail: int = 500, max_field: int = 1024) -> DeadLetter:
        """A letter whose value is cut to ``max_bytes``, detail to ``max_detail`` characters and
        every bytes or text origin field to ``max_field`` bytes (text: UTF-8, cut at a character
        boundary; ``<name>.length`` counts its UTF-8 bytes), so delivering it can never fail for
        size (a sink's request limit, where the origin travels as headers): one oversized bad
        record, or one with an oversized key, must not stop the pipeline.

        >>> raw = RawRecord(b"x" * 10, {"offset": 7, "key": b"k" * 2000})
        >>> letter = DeadLetter.bounded(raw, "invalid_json", "bad", max_bytes=4)
        >>> letter.record.value, letter.length, letter.truncated, len(letter.record.origin["key"])
        (b'xxxx', 10, True, 1024)
        >>> letter.record.origin["key.length"], letter.record.origin["key.sha256"][:12]
        (2000, '1c8123314be7')
        >>> DeadLetter.bounded(RawRecord(None, {"offset": 8}), "tombstone", "no value", max_bytes=4).length is None
        True
        """
        if len(detail) > max_detail:
            detail = detail[:max_detail] + "..."
        origin: dict[str, Any] | None = None
        for name, field_value in record.origin.items():
            data = field_value.encode("utf-8", "surrogatepass") if isinstance(field_value, str) else field_value
            if isinstance(data, (bytes, bytearray)) and len(data) > max_field:
                origin = origin if origin is not None else dict(record.origin)
                kept = data[:max_field]
                origin[name] = kept.decode("utf-8", "ignore") if isinstance(field_value, str) else kept
                origin[f"{name}.length"], origin[f"{name}.sha256"] = len(data), hashlib.sha256(data).hexdigest()
        if origin is not None:
            record = replace(record, origin=origin)
        value = record.value
        if value is None:
            return cls(record, reason, detail)
        return cls(record, reason, detail, len(value), hashlib.sha256(value).hexdigest()).shortened(max_bytes)

    def shortened(self, max_bytes: int) -> DeadLetter:
        """This letter with its value cut to ``max_bytes``; ``length`` and ``sha256`` keep
        describing the original value (computed here if the letter had none)."""
        value = self.record.value
        if value is None or len(value) <= max_bytes:
            return self
        length, digest = ((self.length, self.sha256) if self.length is not None
                          else (len(value), hashlib.sha256(value).hexdigest()))
        return replace(self, record=replace(self.record, value=value[:max_bytes]), length=length, sha256=digest)


class Source(Protocol):
    """Yields raw records in bounded batches."""

    def poll(self, max_records: int, timeout_s: float) -> Sequence[RawRecord]:
        """Up to ``max_records`` records (a list or a :class:`RecordBatch`), waiting at most
        ``timeout_s``; empty when none arrived."""
        ...

    def commit(self) -> None:
        """Mark everything returned so far as processed."""
        ...

    def pause(self) -> None:
        """Stop fetching (budget halted or a long update); poll() keeps the session alive."""
        ...

    def resume(self) -> None: ...

    @property
    def exhausted(self) -> bool:
        """True when a finite source has nothing more to give."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class SeekableSource(Source, Protocol):
    """A source with offsets (Kafka): the pipeline commits it at the positions after the batches
    it has applied, which may lag what ``poll()`` returned by the batch in flight."""

    def positions(self) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` after every record returned so far."""
        ...

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None: ...

    def commit(self, positions: Mapping[tuple[str, int], int] | None = None) -> None:
        """Mark the records before ``positions`` (default: all returned so far) as processed."""
        ...

    def commit_now(self, positions: Mapping[tuple[str, int], int] | None = None) -> None:
        """Like ``commit`` but now, whatever the commit interval (a graceful stop)."""
        ...


@runtime_checkable
class RebalancingSource(Protocol):
    """A source whose partitions can be revoked (Kafka): before giving them up it calls
    ``before_revoke()``, which finishes the batch in flight and returns the positions to commit."""

    before_revoke: Callable[[], Mapping[tuple[str, int], int] | None] | None


@runtime_checkable
class FiniteSource(Protocol):
    """A source that knows how many records it will deliver in all (a file, a list), so a run can
    warn at start when the data cannot reach the planned steps."""

    def total(self) -> int | None:
        """Records this source delivers from start to end (``None``: not known)."""
        ...


@runtime_checkable
class LagReporting(Protocol):
    """A source that knows how far behind each partition it is (for the consumer-lag metric)."""

    def lag(self) -> dict[tuple[str, int], int]: ...


@dataclass(frozen=True)
class Coverage:
    """What a partitioned source reads right now: of the ``topics`` it was given, it holds
    ``held`` of the ``partitions`` that the existing ones have, and ``missing`` names those that
    do not exist (or that its user may not see). Public: topic metadata, no record.

    >>> Coverage(held=0, partitions=3, missing=()).problem()
    'holds none of the 3 partitions of its topics, so nothing is consumed'
    >>> Coverage(held=2, partitions=2, missing=()).problem() is None
    True
    """

    held: int
    partitions: int
    topics: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    def problem(self) -> str | None:
        """Why records that arrive may not be consumed, in one line; ``None`` when all is read."""
        if self.missing:
            names = ", ".join(repr(t) for t in self.missing)
            return (f"input topic{'s' if len(self.missing) > 1 else ''} {names} "
                    f"{'do' if len(self.missing) > 1 else 'does'} not exist (or this user may not describe "
                    "it), so nothing is consumed from it")
        if not self.held:
            return f"holds none of the {self.partitions} partitions of its topics, so nothing is consumed"
        return None


@runtime_checkable
class PartitionedSource(Protocol):
    """A source that reads partitions of named topics (Kafka) and can say which it holds."""

    def coverage(self) -> Coverage:
        """The partitions held and the topics missing now (asks the broker for metadata)."""
        ...


@runtime_checkable
class Sink(Protocol):
    """Publishes model messages (keyed by model id)."""

    def publish(self, key: str, message: Mapping[str, Any]) -> None:
        """Deliver one message; raise on failure (never drop silently)."""
        ...

    def flush(self) -> None: ...

    def latest(self, key: str) -> Mapping[str, Any] | None:
        """The last message published under ``key`` (by this or an earlier process), ``None``
        when there is none or the sink cannot read back (stdout): evidence that binds the
        published model to the ledger at start."""
        ...

    def close(self) -> None: ...


class DeadLetterSink(Protocol):
    """Receives rejected records with their reasons."""

    def send(self, letters: Sequence[DeadLetter]) -> None: ...

    def flush(self) -> None:
        """Return once every letter sent so far is delivered; raise if one was not (the
        pipeline commits no source offset past an undelivered letter)."""
        ...

    def close(self) -> None: ...


def reverse_lines(path: str | os.PathLike[str], block: int = 1 << 16) -> Iterator[tuple[bytes, bool]]:
    """``(line, torn)`` for the lines of ``path`` from last to first, without their newline.

    Reads fixed-size blocks from the end, so memory holds one block plus one line. Only the
    very last piece can be torn (no newline after it: a write cut by a crash); blank lines are
    left out.
    """
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        tail = b""
        first = True
        while end > 0:
            start = max(0, end - block)
            fh.seek(start)
            chunk = fh.read(end - start) + tail
            end = start
            lines = chunk.split(b"\n")
            tail = lines.pop(0) if start > 0 else b""
            for i in range(len(lines) - 1, -1, -1):
                torn = first
                first = False
                if lines[i].strip():
                    yield lines[i], torn
