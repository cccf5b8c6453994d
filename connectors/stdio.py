"""stdin source, stdout model sink and stderr dead-letter sink, for shell pipelines."""

from __future__ import annotations

import json
import queue
import sys
import threading
from typing import Any, BinaryIO, Mapping, Sequence

from connectors.jsonl import dead_letter_to_dict
from stream_vips.io import DeadLetter, RawRecord

_EOF = object()


class StdinSource:
    """Reads one record per line from stdin (or ``stream``).

    A daemon thread does the blocking reads so that :meth:`poll` honours its timeout and the
    run loop stays responsive to signals.
    """

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdin.buffer
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=100_000)
        self._eof = False
        self._paused = False
        self._line = 0
        threading.Thread(target=self._reader, name="stdin-reader", daemon=True).start()

    def _reader(self) -> None:
        for raw in self._stream:
            self._queue.put(raw)
        self._queue.put(_EOF)

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        if self._paused or self._eof:
            return []
        out: list[RawRecord] = []
        try:
            item = self._queue.get(timeout=timeout_s)
            while True:
                if item is _EOF:
                    self._eof = True
                    break
                self._line += 1
                value = item.rstrip(b"\r\n")
                if value.strip():
                    out.append(RawRecord(value, {"stdin_line": self._line}))
                if len(out) >= max_records:
                    break
                item = self._queue.get_nowait()
        except queue.Empty:
            pass
        return out

    def commit(self) -> None:
        """stdin cannot be rewound; nothing to commit."""

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    @property
    def exhausted(self) -> bool:
        return self._eof

    def close(self) -> None:
        """The reader thread is a daemon; it ends with the process."""


class StdoutSink:
    """Writes each model message as one JSON line to stdout (or ``stream``)."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream

    def _out(self) -> Any:
        return self._stream if self._stream is not None else sys.stdout

    def publish(self, key: str, message: Mapping[str, Any]) -> None:
        out = self._out()
        out.write(json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n")
        out.flush()

    def flush(self) -> None:
        self._out().flush()

    def close(self) -> None:
        self.flush()


class StderrDeadLetterSink:
    """Writes each rejected record with its reason as one JSON line to stderr."""

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream

    def _out(self) -> Any:
        return self._stream if self._stream is not None else sys.stderr

    def send(self, letters: Sequence[DeadLetter]) -> None:
        out = self._out()
        out.write("".join(json.dumps(dead_letter_to_dict(x), default=str) + "\n" for x in letters))
        out.flush()

    def flush(self) -> None:
        self._out().flush()

    def close(self) -> None:
        self.flush()
