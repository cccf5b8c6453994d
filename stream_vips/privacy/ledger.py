"""Ledgers: the durable, ordered record of every privacy event.

An event is in the ledger before its release is computed, so a crash can only make the ledger
claim more spending than happened, never less; a restart replays it and spent epsilon is never
reset. ``FileLedger`` keeps one checksummed JSON line per event, after a first *genesis* line::

    {"genesis": {"ledger_id": "<random hex>", "created_at": "...", "supersedes": []}, "sha256": "..."}
    {"step": 0, "event": {"type": "subsampled_gaussian", ...}, "at": 10000, "sha256": "<hex>"}

and fsyncs the file (and, on creation, its directory) before ``append`` returns.

**Binding.** The genesis gives every ledger a random ``ledger_id``. Everything the ledger pays
for carries that id and the step it reached: model messages (``privacy.ledger_id`` and
``version``) and reservoir checkpoints. :func:`check_binding` refuses a start when such state
names another ledger or a step this ledger does not hold, which is what a deleted, replaced or
rolled-back ledger looks like: without it a lost ledger silently resets the spent budget. A
deliberate reset writes a new genesis whose ``supersedes`` lists the old ids (``stream-vips
reset``), so the old state is accepted and the decision is on record.

**Positions.** ``at`` is the stream position (arrivals offered to the reservoir) at which the
step was taken. A restart from a checkpoint replays the stream from the checkpoint's position;
it takes no step at a position an earlier life already paid for (:attr:`Ledger.last_position`),
so a crash loop never spends budget twice on the same reservoir.

**Windows.** A step taken under window accounting (``privacy.accounting: window``) carries
``"window": L``, the most consecutive steps any record of it can be in. The budget monitor
reads them back (:meth:`Ledger.windows`) and refuses to account a ledger with a shorter window
than one it was paid under, or steps taken without a window (any record could be in all of them),
which would lower the spent epsilon a restart reports.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from stream_vips.errors import StreamVipsError
from stream_vips.privacy.event_types import Event

from .events import event_from_dict

log = logging.getLogger(__name__)


class LedgerCorrupt(StreamVipsError, RuntimeError):
    """A ledger that cannot be trusted: refusing to start rather than under-count spending."""


class LedgerLocked(StreamVipsError, RuntimeError):
    """Another process holds the ledger open for writing."""


class LedgerMismatch(StreamVipsError, RuntimeError):
    """State (a checkpoint, a published model) that this ledger did not pay for: the ledger was
    deleted, replaced or rolled back. Refusing to start rather than reset the spent budget."""


class LedgerWriteError(StreamVipsError, OSError):
    """The ledger file could not be written (a full disk, an I/O error; still an ``OSError``, as
    before). The ledger still holds whole lines only, and no step whose line is missing was
    released: a step is appended before its noise is drawn (check, ledger, noise, release)."""


@runtime_checkable
class Ledger(Protocol):
    """Durable privacy events (see the module docstring)."""

    @property
    def ledger_id(self) -> str:
        """The random id from the genesis (``legacy-...`` for a ledger written before geneses)."""

    @property
    def supersedes(self) -> tuple[str, ...]:
        """Ids of ledgers that a deliberate reset replaced with this one."""

    @property
    def last_position(self) -> int | None:
        """The furthest stream position of a paid step (``None``: no step, or not recorded)."""

    def append(self, event: Event, position: int | None = None) -> int:
        """Record ``event`` (taken at stream ``position``) durably; returns its step (0, 1, ...)."""

    def append_many(self, entries: Sequence[tuple[Event, int | None]], window: int | None = None) -> int:
        """Record ``(event, position)`` entries durably in one write (all or none, as far as a
        restart can tell), each under accounting ``window`` (``None``: stream accounting);
        returns the step of the first."""

    def events(self) -> list[Event]:
        """All recorded events, in order."""

    def windows(self) -> list[int | None]:
        """Each recorded step's accounting window (``None``: taken under stream accounting)."""

    def close(self) -> None: ...


def new_genesis(supersedes: Iterable[str] = ()) -> dict[str, Any]:
    """A genesis body with a fresh random id."""
    # timezone.utc, not the UTC alias: this module is mutation-tested and its code stays as recorded
    return {"ledger_id": uuid.uuid4().hex, "created_at": datetime.now(timezone.utc).isoformat(),  # noqa: UP017
            "supersedes": sorted(set(supersedes))}


class LedgerSteps:
    """Events, positions and genesis: the state every ledger kind keeps in memory (a mixin)."""

    _events: list[Event]
    _positions: list[int | None]
    _windows: list[int | None]
    _genesis: dict[str, Any]

    @property
    def ledger_id(self) -> str:
        return str(self._genesis["ledger_id"])

    @property
    def supersedes(self) -> tuple[str, ...]:
        return tuple(self._genesis.get("supersedes", ()))

    @property
    def last_position(self) -> int | None:
        """The furthest position of a paid step (prepaid steps a late step left unused sit at their
        planned positions, which can be past the step that replaced them)."""
        return max((p for p in self._positions if p is not None), default=None)

    def events(self) -> list[Event]:
        return list(self._events)

    def windows(self) -> list[int | None]:
        return list(self._windows)

    def append(self: Ledger, event: Event, position: int | None = None) -> int:
        return self.append_many([(event, position)])

    def _record(self, entries: Sequence[tuple[Event, int | None]], window: int | None = None) -> int:
        first = len(self._events)
        for event, position in entries:
            self._events.append(event)
            self._positions.append(position)
            self._windows.append(window)
        return first


class MemoryLedger(LedgerSteps):
    """In-process ledger (tests, demos, notebooks); nothing survives the process."""

    def __init__(self, events: list[Event] | None = None) -> None:
        self._events = list(events or [])
        self._positions = [None] * len(self._events)
        self._windows = [None] * len(self._events)
        self._genesis = new_genesis()

    def append_many(self, entries: Sequence[tuple[Event, int | None]], window: int | None = None) -> int:
        for event, _ in entries:
            event.to_dict()  # same contract as durable ledgers: the event must serialize
        return self._record(entries, window)

    def close(self) -> None:
        pass


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _line(body: dict) -> bytes:
    return (json.dumps({**body, "sha256": _digest(body)}, sort_keys=True, separators=(",", ":")) + "\n").encode()


def encode_line(step: int, event: Event, position: int | None = None, window: int | None = None) -> bytes:
    """The ledger line for ``event`` at ``step`` (newline-terminated)."""
    body: dict[str, Any] = {"step": step, "event": event.to_dict()}
    if position is not None:
        body["at"] = int(position)
    if window is not None:
        body["window"] = int(window)
    return _line(body)


#: How every genesis line starts (keys are written sorted, without spaces).
_GENESIS_PREFIX = b'{"genesis":'
#: How every event line starts: :func:`encode_line` writes sorted keys, so ``at`` comes first when
#: a position is given, else ``event`` (tests/test_privacy_ledger.py checks both).
_EVENT_PREFIXES = (b'{"at":', b'{"event":')


def _could_start(partial: bytes, prefixes: Sequence[bytes]) -> bool:
    """Whether an incomplete line could be a torn write of a line beginning with one of ``prefixes``."""
    return any(partial.startswith(p) or p.startswith(partial) for p in prefixes)


def is_torn_write(line: bytes, first: bool) -> bool:
    """Whether ``line``, an incomplete last line (no newline), is our write torn by a crash, to be
    cut on open: it could be the start of an event line, or of a genesis when it is the file's
    ``first`` line (a ledger written before geneses starts with an event), or it is NUL bytes
    only, which is how a crash leaves a file whose size was extended but whose blocks were never
    written (XFS, ext4 ``data=writeback``). Anything else is not ours and is kept
    (:class:`FileLedger`): printable bytes, and binary data that merely begins with a NUL (a
    foreign file must never be cut).

    >>> is_torn_write(b'{"ev', first=False), is_torn_write(b"\\0\\0\\0", first=True)
    (True, True)
    >>> is_torn_write(b"note", first=False), is_torn_write(b"\\0\\0ftyp", first=True)
    (False, False)
    """
    return not line.strip(b"\0") or _could_start(line, (_GENESIS_PREFIX, *_EVENT_PREFIXES) if first
                                                  else _EVENT_PREFIXES)


def starts_like_ledger(first_line: bytes) -> bool:
    """Whether a file whose first line (as read, with its newline if it has one) is ``first_line``
    may be a privacy ledger: that line begins like a genesis or an event line (a ledger written
    before geneses), or it is incomplete and a torn first line (:func:`is_torn_write`: the same
    rule :class:`FileLedger` cuts by, so a file is a ledger to both or to neither). Checksums are
    not checked: a ledger with a damaged line still records spent budget, so nothing may replace it.

    >>> starts_like_ledger(encode_genesis(new_genesis())[:-9] + b"\\n"), starts_like_ledger(b'{"gen')
    (True, True)
    >>> starts_like_ledger(b'{"schema": "model-message.v1"}\\n'), starts_like_ledger(b"{\\n")
    (False, False)
    """
    if first_line.endswith(b"\n"):
        return first_line.startswith((_GENESIS_PREFIX, *_EVENT_PREFIXES))
    return bool(first_line) and is_torn_write(first_line, first=True)


def encode_genesis(genesis: dict[str, Any]) -> bytes:
    """The genesis line (newline-terminated)."""
    return _line({"genesis": genesis})


_SHA = b',"sha256":"'


def _load(raw: bytes) -> dict:
    """The checked body of one line. Lines are written in canonical form (sorted keys, no
    spaces), so the body's canonical form is the line without its sha256 member: hashing those
    bytes checks a line with one sha256 and one parse (a restart replays 10^6 lines in seconds).
    A line in any other form is checked by re-serializing its body canonically."""
    i = raw.find(_SHA)
    end = i + len(_SHA) + 64
    if i > 0 and raw[end:end + 1] == b'"':
        body_bytes = raw[:i] + raw[end + 1:]
        if hashlib.sha256(body_bytes).hexdigest().encode() == raw[i + len(_SHA):end]:
            try:
                body = orjson.loads(body_bytes)
            except orjson.JSONDecodeError:
                body = None
            if isinstance(body, dict):
                return body
    try:
        obj = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    if not isinstance(obj, dict) or "sha256" not in obj:
        raise ValueError("not a ledger line (no sha256)")
    body = {k: v for k, v in obj.items() if k != "sha256"}
    if obj["sha256"] != _digest(body):
        raise ValueError("checksum mismatch")
    return body


def decode_genesis(raw: bytes) -> dict[str, Any] | None:
    """The genesis on a line, ``None`` when the line is an event; ValueError when it is neither."""
    body = _load(raw)
    if set(body) != {"genesis"}:
        return None
    genesis = body["genesis"]
    if not isinstance(genesis, dict) or not isinstance(genesis.get("ledger_id"), str):
        raise ValueError("genesis without a ledger_id")
    return genesis


def decode_line(raw: bytes, expected_step: int) -> tuple[Event, int | None, int | None]:
    """``(event, position, window)`` on one event line; raises ValueError saying what is wrong."""
    body = _load(raw)
    if not {"step", "event"} <= set(body) <= {"step", "event", "at", "window"}:
        raise ValueError("not a ledger line (expected keys step, event, [at], [window], sha256)")
    if body["step"] != expected_step:
        raise ValueError(f"step {body['step']!r} where {expected_step} was expected")
    at, window = body.get("at"), body.get("window")
    if at is not None and (isinstance(at, bool) or not isinstance(at, int) or at < 0):
        raise ValueError(f"position {at!r} is not a non-negative integer")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window {window!r} is not a positive integer")
    return _event(body["event"]), at, window


_EVENTS: dict = {}  # one object per distinct event: a ledger of 10^6 identical steps holds one


def _event(data: dict) -> Event:
    try:
        key = tuple(sorted(data.items()))
        hash(key)
    except TypeError:
        return event_from_dict(data)
    event = _EVENTS.get(key)
    if event is None:
        if len(_EVENTS) > 4096:
            _EVENTS.clear()
        event = _EVENTS[key] = event_from_dict(data)
    return event


def legacy_genesis(first_line: bytes) -> dict[str, Any]:
    """The identity of a ledger written before geneses existed: derived from its first line."""
    return {"ledger_id": "legacy-" + hashlib.sha256(first_line).hexdigest()[:24], "supersedes": []}


def replay_lines(lines: Iterable[bytes], where: str) -> tuple[dict[str, Any] | None, list[Event], list[int | None],
                                                             list[int | None]]:
    """``(genesis, events, positions, windows)`` from complete ledger lines; :class:`LedgerCorrupt`
    names the first bad line (``where`` says which ledger)."""
    genesis = None
    events: list[Event] = []
    positions: list[int | None] = []
    windows: list[int | None] = []
    for i, raw in enumerate(lines):
        try:
            if i == 0:
                genesis = decode_genesis(raw)
                if genesis is not None:
                    continue
                genesis = legacy_genesis(raw)
            event, at, window = decode_line(raw, len(events))
        except ValueError as exc:
            raise LedgerCorrupt(f"{where} line {i + 1} is corrupt: {exc}") from exc
        except RecursionError:  # JSON nested deeper than Python's stack: no line of ours
            raise LedgerCorrupt(f"{where} line {i + 1} is corrupt: nested too deeply to be a ledger line") from None
        events.append(event)
        positions.append(at)
        windows.append(window)
    return genesis, events, positions, windows


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a file created or renamed in ``directory`` durable: fsync the directory's entries."""
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


#: Ledger files this process holds locked, by identity (device, inode: the same file under any
#: path) -> the pid that locked it (a forked child inherits the map, not the ownership), so a
#: second open can say who holds the lock.
_HELD: dict[tuple[int, int], int] = {}


class FileLedger(LedgerSteps):
    """Append-only file ledger, fsynced per event and replayed on open.

    A new (or empty) file gets a genesis line first. On open, only a last line without its
    newline that could be the start of a ledger line is a write torn by a crash (its ``append``
    never returned): it is cut with a warning. "Could be the start" means a prefix of a line as
    written here, or beginning like one: an event line (``{"at":`` or ``{"event":``), or a
    genesis (``{"genesis":``) when it is the only line; or NUL bytes only, which is what a
    crash leaves where the file was extended but its blocks never written (:func:`is_torn_write`).
    Any other incomplete last line is not ours (a data or model file as the only line, foreign
    bytes appended to a ledger): ``LedgerCorrupt`` names it and nothing is cut. Every complete
    line must pass its checksum, even the last one: a complete line that fails is corruption,
    not a torn write, and ``LedgerCorrupt`` names it (cutting it would under-count and delete
    the evidence). The file is locked (``flock``) so two processes cannot
    both spend from it.
    """

    def __init__(self, path: str | os.PathLike, supersedes: Iterable[str] = ()) -> None:
        self.path = Path(path)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self._held: tuple[int, int] | None = None  # this file's key in _HELD while we hold its lock
        try:
            st = os.fstat(self._fd)
            key = st.st_dev, st.st_ino
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                if _HELD.get(key) == os.getpid():
                    raise LedgerLocked(f"ledger {self.path} is held by this process (close the earlier PrivateLearner, "
                                       "or use `with PrivateLearner(...) as learner:`)") from exc
                raise LedgerLocked(f"ledger {self.path} is in use by another process") from exc
            self._held = key
            _HELD[key] = os.getpid()
            genesis, self._events, self._positions, self._windows = self._replay()
            if genesis is None:  # a new or empty file: the genesis is its first line
                genesis = new_genesis(supersedes)
                self._write(encode_genesis(genesis))
                log.info("ledger %s created with id %s", self.path, genesis["ledger_id"])
            elif supersedes:
                raise LedgerCorrupt(f"ledger {self.path} already exists; a reset starts a new file")
            self._genesis = genesis
            if created:
                fsync_dir(self.path.parent)
        except BaseException:
            self.close()
            raise

    def _replay(self) -> tuple[dict[str, Any] | None, list[Event], list[int | None], list[int | None]]:
        """Replay the complete lines, streaming the file (memory holds the events, not the file);
        cut a torn last line."""
        self._size = 0
        torn: list[int] = []

        def complete_lines() -> Iterator[bytes]:
            with open(self.path, "rb") as fh:
                for number, line in enumerate(fh, 1):
                    if not line.endswith(b"\n"):
                        if number == 1 and not is_torn_write(line, first=True):
                            # only a genesis can be torn before any complete line: anything else is
                            # some other file (data, a model), which must not be cut
                            raise LedgerCorrupt(f"{self.path} is not a ledger: its only line is incomplete and is "
                                                "not a ledger line; refusing to cut it (choose another ledger path)")
                        if number > 1 and not is_torn_write(line, first=False):
                            # not how our writer starts a line: bytes someone appended, kept as evidence
                            raise LedgerCorrupt(f"ledger {self.path} line {number} is incomplete and is not the start "
                                                "of a ledger line (appended by something else?); refusing to cut "
                                                "it, nothing was changed: remove that line by hand")
                        torn.append(number)
                        return
                    self._size += len(line)
                    yield line[:-1]

        replayed = replay_lines(complete_lines(), f"ledger {self.path}")
        if torn:
            log.warning("ledger %s: dropping torn last line %d (incomplete line, no newline)", self.path, torn[0])
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        return replayed

    def _write(self, line: bytes) -> None:
        """Append ``line`` (whole lines) and fsync; an OSError (ENOSPC, EIO) becomes
        :class:`LedgerWriteError` after the file is cut back to its whole lines."""
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except BaseException as exc:
            # Never leave a partial line for the next append to extend; if even that fails,
            # stop writing (the torn tail is dropped on the next open).
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self.close()
            if isinstance(exc, OSError):
                raise LedgerWriteError(
                    f"cannot write the privacy ledger {self.path} (privacy.ledger.path): {exc.strerror or exc}; "
                    "no step was released without its ledger line and the ledger holds whole lines only: "
                    "free space (or fix the disk) and restart") from exc
            raise
        self._size += len(line)

    def append_many(self, entries: Sequence[tuple[Event, int | None]], window: int | None = None) -> int:
        """All entries in one write and one fsync; a crash mid-write leaves a prefix of whole
        lines plus a torn one, which only over-counts (entries are appended before release)."""
        if self._fd < 0:
            raise RuntimeError(f"ledger {self.path} is closed")
        first = len(self._events)
        self._write(b"".join(encode_line(first + i, e, p, window) for i, (e, p) in enumerate(entries)))
        return self._record(entries, window)

    def close(self) -> None:
        if self._fd >= 0:
            if self._held is not None:
                _HELD.pop(self._held, None)
                self._held = None
            os.close(self._fd)  # also releases the lock
            self._fd = -1

    def __enter__(self) -> FileLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_binding(ledger: Ledger, what: str, ledger_id: str | None, step: int | None) -> None:
    """Refuse ``what`` (a checkpoint, a published model) that this ledger did not pay for.

    ``ledger_id`` and ``step`` are what that state carries: the id of the ledger that paid for
    it and the number of steps it reflects (a model message: its version + 1). State of a
    superseded ledger (a deliberate reset) is accepted. Raises :class:`LedgerMismatch`.
    """
    if ledger_id is None and ledger.ledger_id.startswith("legacy-"):
        ledger_id = ledger.ledger_id  # written before ledger ids, like this ledger: the step still binds
    if ledger_id is None:
        raise LedgerMismatch(f"{what} names no ledger id (written by an older version or without a "
                             f"ledger): cannot tell which budget paid for it; remove it or run `stream-vips reset`")
    if ledger_id in ledger.supersedes:
        return
    if ledger_id != ledger.ledger_id:
        raise LedgerMismatch(
            f"{what} was paid for by ledger {ledger_id}, but the configured ledger is {ledger.ledger_id} "
            f"with {len(ledger.events())} steps: the ledger was deleted or replaced; restore it, or "
            "run `stream-vips reset` to start a new budget deliberately")
    held = len(ledger.events())
    if step is not None and step > held:
        raise LedgerMismatch(
            f"{what} reflects {step} steps of ledger {ledger_id}, which holds only {held}: the ledger "
            "was rolled back; restore it, or run `stream-vips reset` to start a new budget deliberately")



def read_first_line(path: Path) -> bytes:
    """The file's first line with its newline, if it has one (OSError if unreadable): the probe of
    ``--ledger`` (must be a ledger) and ``--out`` (must not be one)."""
    with open(path, "rb") as fh:
        return fh.readline()


def first_line_is_ledger(path: Path) -> bool | None:
    """Whether the file's first line is a privacy-ledger line, or a torn genesis that opening the
    ledger cuts (``None``: the file is empty). OSError if unreadable."""
    first = read_first_line(path)
    if not first:
        return None
    if not first.endswith(b"\n"):
        return is_torn_write(first, first=True)
    try:
        replay_lines([first.rstrip(b"\n")], f"ledger {path}")
    except LedgerCorrupt:
        return False
    return True
