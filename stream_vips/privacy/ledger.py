"""Ledgers: the durable, ordered record of every privacy event (DESIGN rule 7).

An event is in the ledger before its release is computed, so a crash can only make the ledger
claim more spending than happened, never less; a restart replays it and spent epsilon is never
reset. ``FileLedger`` keeps one checksummed JSON line per event::

    {"step": 0, "event": {"type": "subsampled_gaussian", ...}, "sha256": "<hex of step+event>"}

and fsyncs the file (and, on creation, its directory) before ``append`` returns.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .events import event_from_dict

log = logging.getLogger(__name__)


class LedgerCorrupt(RuntimeError):
    """A ledger that cannot be trusted: refusing to start rather than under-count spending."""


class LedgerLocked(RuntimeError):
    """Another process holds the ledger open for writing."""


@runtime_checkable
class Ledger(Protocol):
    def append(self, event: Any) -> int:
        """Record ``event`` durably; returns its step index (0, 1, ...)."""

    def events(self) -> list:
        """All recorded events, in order."""

    def close(self) -> None: ...


class MemoryLedger:
    """In-process ledger (tests, demos); nothing survives the process."""

    def __init__(self, events: list | None = None) -> None:
        self._events = list(events or [])

    def append(self, event: Any) -> int:
        event.to_dict()  # same contract as durable ledgers: the event must serialize
        self._events.append(event)
        return len(self._events) - 1

    def events(self) -> list:
        return list(self._events)

    def close(self) -> None:
        pass


def _digest(step: int, event: dict) -> str:
    body = json.dumps({"step": step, "event": event}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def encode_line(step: int, event: Any) -> bytes:
    """The ledger line for ``event`` at ``step`` (newline-terminated)."""
    data = event.to_dict()
    line = {"step": step, "event": data, "sha256": _digest(step, data)}
    return (json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _decode_line(raw: bytes, expected_step: int) -> Any:
    """The event on one ledger line; raises ValueError saying what is wrong."""
    try:
        obj = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    if not isinstance(obj, dict) or set(obj) != {"step", "event", "sha256"}:
        raise ValueError("not a ledger line (expected keys step, event, sha256)")
    if obj["sha256"] != _digest(obj["step"], obj["event"]):
        raise ValueError("checksum mismatch")
    if obj["step"] != expected_step:
        raise ValueError(f"step {obj['step']!r} where {expected_step} was expected")
    return event_from_dict(obj["event"])


class FileLedger:
    """Append-only file ledger, fsynced per event and replayed on open.

    On open, a last line that is incomplete (no trailing newline) or fails its checksum is a
    write torn by a crash: it is dropped with a warning and cut from the file (its ``append``
    never returned). Any other bad line raises ``LedgerCorrupt`` naming the line. The file is
    locked (``flock``) so two processes cannot both spend from it.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise LedgerLocked(f"ledger {self.path} is in use by another process") from exc
            if created:
                os.fsync(self._fd)
                self._fsync_dir()
            self._events = self._replay()
        except BaseException:
            os.close(self._fd)
            raise

    def _fsync_dir(self) -> None:
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _replay(self) -> list:
        with open(self.path, "rb") as fh:
            data = fh.read()
        body, newline, tail = data.rpartition(b"\n")
        lines = body.split(b"\n") if newline else []
        events: list = []
        good_bytes = 0
        for i, raw in enumerate(lines):
            try:
                events.append(_decode_line(raw, len(events)))
            except ValueError as exc:
                if i < len(lines) - 1 or tail:
                    raise LedgerCorrupt(f"ledger {self.path} line {i + 1} is corrupt: {exc}") from exc
                self._drop_torn_tail(good_bytes, i + 1, str(exc))
                return events
            good_bytes += len(raw) + 1
        if tail:
            self._drop_torn_tail(good_bytes, len(lines) + 1, "incomplete line (no newline)")
        self._size = good_bytes
        return events

    def _drop_torn_tail(self, good_bytes: int, line_no: int, why: str) -> None:
        log.warning("ledger %s: dropping torn last line %d (%s)", self.path, line_no, why)
        os.ftruncate(self._fd, good_bytes)
        os.fsync(self._fd)
        self._size = good_bytes

    def append(self, event: Any) -> int:
        if self._fd < 0:
            raise RuntimeError(f"ledger {self.path} is closed")
        step = len(self._events)
        line = encode_line(step, event)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        except BaseException:
            # Never leave a partial line for the next append to extend; if even that fails,
            # stop writing (the torn tail is dropped on the next open).
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self.close()
            raise
        self._size += len(line)
        self._events.append(event)
        return step

    def events(self) -> list:
        return list(self._events)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # also releases the lock
            self._fd = -1

    def __enter__(self) -> "FileLedger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
