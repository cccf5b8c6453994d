"""JSON-lines files: a record source, a model sink and a dead-letter sink.

Each sink line is one complete JSON document, written and flushed per call so that a reader
(or a crash) never sees half a message. ``fsync=True`` also forces the bytes to disk.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from stream_vips.io import DeadLetter, RawRecord


class JsonlSource:
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
        self._paused = False

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        if self._paused:
            return []
        deadline = time.monotonic() + timeout_s
        while True:
            lines = list(itertools.islice(self._file, max_records))
            out = []
            for raw in lines:
                self._line += 1
                value = raw.rstrip(b"\r\n")
                if value.strip():
                    out.append(RawRecord(value, {"path": self.path, "line": self._line}))
            if len(lines) < max_records:
                self._eof = True
            if out or not self.follow or time.monotonic() >= deadline:
                return out
            time.sleep(min(0.05, timeout_s))

    def commit(self) -> None:
        """Files have no consumer offsets; progress is the read position."""

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

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
        if not lines:
            return
        self._file.write("".join(line + "\n" for line in lines))
        self._file.flush()
        if self.fsync:
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
        self._write([json.dumps(message, separators=(",", ":"), allow_nan=False)])


def dead_letter_to_dict(letter: DeadLetter) -> dict[str, Any]:
    """JSON form of a dead letter: reason, detail, origin and the original value.

    The value is kept as text when it is valid UTF-8, else base64 (``value_base64``).
    """
    out: dict[str, Any] = {
        "reason": letter.reason,
        "detail": letter.detail,
        "origin": dict(letter.record.origin),
    }
    try:
        out["value"] = letter.record.value.decode("utf-8")
    except UnicodeDecodeError:
        out["value_base64"] = base64.b64encode(letter.record.value).decode("ascii")
    return out


class JsonlDeadLetterSink(_LineWriter):
    """Appends each rejected record with its reason as one JSON line."""

    def __init__(self, path: str = "dead-letters.jsonl", fsync: bool = False) -> None:
        super().__init__(path, fsync)

    def send(self, letters: Sequence[DeadLetter]) -> None:
        self._write([json.dumps(dead_letter_to_dict(letter), default=str) for letter in letters])
