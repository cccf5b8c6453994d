"""The I/O protocols that connectors implement; the core does no network I/O itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence


@dataclass(frozen=True)
class RawRecord:
    """One record as it arrived: the original bytes plus where it came from."""

    value: bytes
    origin: Mapping[str, Any] = field(default_factory=dict)  # e.g. topic, partition, offset


@dataclass(frozen=True)
class DeadLetter:
    """A rejected record: the original bytes, a reason code and a human-readable detail."""

    record: RawRecord
    reason: str
    detail: str


class Source(Protocol):
    """Yields raw records in bounded batches."""

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        """Up to ``max_records`` records, waiting at most ``timeout_s``; [] when none arrived."""
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


class Sink(Protocol):
    """Publishes model messages (keyed by model id)."""

    def publish(self, key: str, message: Mapping[str, Any]) -> None:
        """Deliver one message; raise on failure (never drop silently)."""
        ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class DeadLetterSink(Protocol):
    """Receives rejected records with their reasons."""

    def send(self, letters: Sequence[DeadLetter]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
