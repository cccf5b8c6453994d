"""In-memory source, model sink and dead-letter sink: the embedded connectors used by tests."""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from connectors._lines import PausableSource
from stream_vips.io import DeadLetter, RawRecord


def _as_bytes(value: bytes | str | Any) -> bytes | None:
    """A queued value as record bytes; ``None`` stays a record without a value (a tombstone)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value).encode("utf-8")


class MemorySource(PausableSource):
    """A queue of records. ``values`` may be bytes, str or JSON-serializable objects; ``None``
    is a record without a value, as a Kafka tombstone is (JSON ``null`` is ``b"null"``).

    ``finite=True`` makes the source exhausted once the queue is drained; ``finite=False``
    keeps it open for :meth:`put` until :meth:`finish` is called.
    """

    def __init__(self, values: Iterable[Any] = (), finite: bool = True) -> None:
        self._queue: collections.deque[RawRecord] = collections.deque()
        self._lock = threading.Condition()
        self._finished = finite
        self._offset = 0
        self.commits = 0
        self.committed_offset = 0
        self._delivered = 0
        self.closed = False
        self.put(values)

    def total(self) -> int | None:
        """Records queued in all, once :meth:`finish` (or ``finite=True``) closed the queue."""
        with self._lock:
            return self._delivered + len(self._queue) if self._finished else None

    def put(self, values: Iterable[Any]) -> None:
        """Append records to the queue."""
        with self._lock:
            for value in values:
                self._queue.append(RawRecord(_as_bytes(value), {"offset": self._offset}))
                self._offset += 1
            self._lock.notify_all()

    def finish(self) -> None:
        """Declare that no more records will be put (an open source becomes finite)."""
        with self._lock:
            self._finished = True
            self._lock.notify_all()

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        with self._lock:
            if self.paused:
                return []
            if not self._queue and not self._finished:
                self._lock.wait(timeout_s)
            n = min(max_records, len(self._queue))
            out = [self._queue.popleft() for _ in range(n)]
            self._delivered += n
            return out

    def commit(self) -> None:
        self.commits += 1
        self.committed_offset = self._delivered

    @property
    def exhausted(self) -> bool:
        with self._lock:
            return self._finished and not self._queue

    def close(self) -> None:
        self.closed = True


class MemorySink:
    """Keeps published ``(key, message)`` pairs in :attr:`messages`."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self.flushes = 0
        self.closed = False

    def publish(self, key: str, message: Mapping[str, Any]) -> None:
        if self.closed:
            raise RuntimeError("publish on a closed MemorySink")
        self.messages.append((key, dict(message)))

    def flush(self) -> None:
        self.flushes += 1

    def latest(self, key: str) -> dict[str, Any] | None:
        return next((m for k, m in reversed(self.messages) if k == key), None)

    def close(self) -> None:
        self.closed = True


class MemoryDeadLetterSink:
    """Keeps rejected records in :attr:`letters`."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []
        self.closed = False

    def send(self, letters: Sequence[DeadLetter]) -> None:
        self.letters.extend(letters)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True
