"""JSON-lines files: a record source, a model sink and a dead-letter sink.

Each sink line is one complete JSON document, written unbuffered per call so that a reader sees
every message at once. A write that fails part way (a full disk) is cut back to the last whole
line before the error is raised, so the next message never continues a torn one (if even the
cut fails, the sink closes: a torn last line is then what a crash leaves). ``fsync=True`` also
forces the bytes to disk.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from connectors._lines import PausableSource, dead_letter_line, last_message, line_value, message_line
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
    """Appends whole lines to ``path`` through an unbuffered ``O_APPEND`` descriptor."""

    def __init__(self, path: str, fsync: bool) -> None:
        self.path = str(path)
        self.fsync = bool(fsync)
        parent = Path(self.path).parent
        parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _write(self, lines: Sequence[str]) -> None:
        """Append ``lines`` in one write; on failure the file is cut back to its size before it."""
        if not lines:
            return
        if self._fd < 0:
            raise ValueError(f"{self.path}: write to a closed sink")
        size = os.fstat(self._fd).st_size
        try:
            view = memoryview("".join(line + "\n" for line in lines).encode("utf-8"))
            while view:
                view = view[os.write(self._fd, view):]
            if self.fsync:
                os.fsync(self._fd)
        except BaseException:
            try:
                os.ftruncate(self._fd, size)
            except OSError:
                self.close()  # a torn last line, as after a crash: write nothing after it
            raise

    def flush(self) -> None:
        """Nothing is buffered: every write went to the file when ``_write`` returned."""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


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
