"""stdin source, stdout model sink and stderr dead-letter sink, for shell pipelines."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, TextIO

from connectors._lines import PausableSource, dead_letter_line, line_value, message_line, write_lines
from stream_vips.io import DeadLetter, RawRecord

_EOF = object()


class StdinSource(PausableSource):
    """Reads one record per line from stdin (or ``stream``).

    A daemon thread does the blocking reads so that :meth:`poll` honours its timeout and the
    run loop stays responsive to signals.
    """

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdin.buffer
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=100_000)
        self._eof = False
        self._line = 0
        threading.Thread(target=self._reader, name="stdin-reader", daemon=True).start()

    def _reader(self) -> None:
        for raw in self._stream:
            self._queue.put(raw)
        self._queue.put(_EOF)

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        if self.paused or self._eof:
            return []
        out: list[RawRecord] = []
        try:
            item = self._queue.get(timeout=timeout_s)
            while True:
                if item is _EOF:
                    self._eof = True
                    break
                self._line += 1
                value = line_value(item)
                if value is not None:
                    out.append(RawRecord(value, {"stdin_line": self._line}))
                if len(out) >= max_records:
                    break
                item = self._queue.get_nowait()
        except queue.Empty:
            pass
        return out

    def commit(self) -> None:
        """stdin cannot be rewound; nothing to commit."""

    @property
    def exhausted(self) -> bool:
        return self._eof

    def close(self) -> None:
        """The reader thread is a daemon; it ends with the process."""


class _StdStream:
    """Writes lines to ``stream``, or to the process stream :attr:`default` looked up at each call."""

    default: str = "stdout"

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def _out(self) -> TextIO:
        return self._stream if self._stream is not None else getattr(sys, self.default)

    def flush(self) -> None:
        self._out().flush()

    def close(self) -> None:
        self.flush()


class StdoutSink(_StdStream):
    """Writes each model message as one JSON line to stdout (or ``stream``)."""

    def publish(self, key: str, message: Mapping[str, Any]) -> None:
        write_lines(self._out(), [message_line(message)])

    def latest(self, key: str) -> None:
        """A stream cannot be read back: no evidence to check at start."""
        return None


class StderrDeadLetterSink(_StdStream):
    """Writes each rejected record with its reason as one JSON line to stderr (or ``stream``)."""

    default = "stderr"

    def send(self, letters: Sequence[DeadLetter]) -> None:
        write_lines(self._out(), [dead_letter_line(letter) for letter in letters])
