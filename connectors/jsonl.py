"""JSON-lines files: a record source, a model sink and a dead-letter sink.

Each sink line is one complete JSON document, written and flushed per call so that a reader
(or a crash) never sees half a message. ``fsync=True`` also forces the bytes to disk.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from connectors._lines import (PausableSource, dead_letter_line, last_message, line_value, message_line,
                               write_lines)
from stream_vips.io import DeadLetter, RawRecord


class JsonlSource(PausableSource):
    """Reads one record per line from ``path``; blank lines are skipped.

    With ``follow=True`` the source behaves like ``tail -f``: it is never exhausted and
    waits up to ``timeout_s`` for new lines.
    """

    def __init__(self, path: str, follow: bool = False) -> None:
        self.path = str(path)
        self.follow = bool(follow)
        self._file = open(self.path, "rb")
        self._line = 0
        self._eof = False

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        if self.paused:
            return []
        deadline = time.monotonic() + timeout_s
        while True:
            lines = list(itertools.islice(self._file, max_records))
            out = []
            for raw in lines:
                self._line += 1
                value = line_value(raw)
                if value is not None:
                    out.append(RawRecord(value, {"path": self.path, "line": self._line}))
            if len(lines) < max_records:
                self._eof = True
            if out or not self.follow or time.monotonic() >= deadline:
                return out
            time.sleep(min(0.05, timeout_s))

    def commit(self) -> None:
        """Files have no consumer offsets; progress is the read position."""

    def total(self) -> int | None:
        """Non-blank lines in the file (``None`` when following: the file grows)."""
        if self.follow:
            return None
        with open(self.path, "rb") as fh:
            return sum(1 for raw in fh if raw.strip())

    @property
    def exhausted(self) -> bool:
        return self._eof and not self.follow

    def close(self) -> None:
        self._file.close()


class _LineWriter:
    def __init__(self, path: str, fsync: bool) -> None:
        self.path = str(path)
        self.fsync = bool(fsync)
        parent = Path(self.path).parent
        parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def _write(self, lines: Sequence[str]) -> None:
        write_lines(self._file, lines)
        if lines and self.fsync:
            os.fsync(self._file.fileno())

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class JsonlSink(_LineWriter):
    """Appends each model message as one JSON line (the key is the message's ``model_id``)."""

    def __init__(self, path: str = "models.jsonl", fsync: bool = False) -> None:
        super().__init__(path, fsync)

    def publish(self, key: str, message: Mapping[str, Any]) -> None:
        self._write([message_line(message)])

    def latest(self, key: str) -> dict[str, Any] | None:
        """The last message for ``key`` in the file (also from earlier runs)."""
        self.flush()
        return last_message(self.path, key)


class JsonlDeadLetterSink(_LineWriter):
    """Appends each rejected record with its reason as one JSON line."""

    def __init__(self, path: str = "dead-letters.jsonl", fsync: bool = False) -> None:
        super().__init__(path, fsync)

    def send(self, letters: Sequence[DeadLetter]) -> None:
        self._write([dead_letter_line(letter) for letter in letters])
