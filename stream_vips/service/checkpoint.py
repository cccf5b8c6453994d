"""Restart without losing records: the reservoir is checkpointed together with the offsets it reflects.

Strategy (issue 6, item 5). Kafka offsets alone cannot rebuild a reservoir: Algorithm R keeps
records from anywhere in the stream's past. So every time the pipeline commits its source, a
:class:`Checkpoint` first writes, in one file, the reservoir (its rows, ``seen`` count and RNG
state), the model's natural parameters, the trigger's pending count and the source positions
(``{(topic, partition): next offset}``) those reflect. The write is atomic (temporary file,
fsync, rename, fsync of the directory) and the file is created with mode 0600 because it holds
raw records. Only then are the offsets committed to Kafka (for lag monitoring and for a fresh
start without a checkpoint).

On restart :func:`attach` restores the checkpoint and seeks the source to its offsets, so the
records after them are consumed again and enter the reservoir exactly as they would have
without the crash (same positions, same RNG state: reservoir membership is still a function of
arrival positions and the RNG only, privacy rule 1 in docs/privacy.md). Spending is never reset: the ledger, not the
checkpoint, counts steps, so a step released after the last checkpoint stays charged and the
replayed stream's next step gets a new ledger index and fresh noise (the engine's noise RNG is
deliberately not checkpointed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stream_vips.core.learner import StateMismatch
from stream_vips.errors import StreamVipsError
from stream_vips.io import SeekableSource
from stream_vips.snapshot import from_npz, join_arrays, split_arrays, to_npz, write_private

if TYPE_CHECKING:
    from stream_vips.core.learner import PrivateLearner
    from stream_vips.service.app import Application

FORMAT_VERSION = 2  # 2: bound to the ledger (ledger_id, ledger_steps)


class CheckpointError(StreamVipsError, RuntimeError):
    """A checkpoint that does not belong to this pipeline or cannot be read."""


def _pack(state: Mapping[str, Any]) -> bytes:
    arrays: dict[str, np.ndarray] = {}
    meta = {"format": FORMAT_VERSION, "model_family": state["model_family"],
            "offsets": [[t, p, o] for (t, p), o in sorted(state["offsets"].items())],
            "trigger_pending": state["trigger_pending"],
            "ledger_id": state["ledger_id"], "ledger_steps": state["ledger_steps"],
            "reservoir": split_arrays(state["reservoir"], "reservoir/", arrays),
            "model": split_arrays({k: np.asarray(v) for k, v in state["model"].items()}, "model/", arrays)}
    return to_npz(meta, arrays)


def _unpack(data: bytes) -> dict[str, Any]:
    meta, arrays = from_npz(data)
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint format {meta.get('format')!r} is not {FORMAT_VERSION} (format 1 names no ledger, so "
            "it cannot be bound to the budget that paid for it; move it away to start from the committed offsets)")
    return {
        "model_family": meta["model_family"],
        "offsets": {(t, int(p)): int(o) for t, p, o in meta["offsets"]},
        "reservoir": join_arrays(meta["reservoir"], "reservoir/", arrays),
        "model": join_arrays(meta["model"], "model/", arrays),
        "trigger_pending": int(meta["trigger_pending"]),
        "ledger_id": meta["ledger_id"],
        "ledger_steps": meta["ledger_steps"],
    }


class Checkpoint:
    """One checkpoint file (written atomically, mode 0600)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.writes = 0

    def save(self, learner: PrivateLearner, offsets: Mapping[tuple[str, int], int]) -> None:
        """Write ``learner``'s state (:meth:`PrivateLearner.state`) and ``offsets`` atomically."""
        write_private(self.path, _pack({**learner.state(), "offsets": dict(offsets)}))
        self.writes += 1

    def load(self) -> dict[str, Any] | None:
        """The saved state, or ``None`` when there is no checkpoint yet."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:  # a directory, no permission: a configuration error, not a crash
            raise CheckpointError(f"checkpoint {self.path} cannot be read: {exc.strerror or exc}") from exc
        try:
            return _unpack(data)
        except (ValueError, KeyError, OSError) as exc:
            raise CheckpointError(f"checkpoint {self.path} cannot be read: {exc}") from exc

    def restore(self, learner: PrivateLearner) -> dict[tuple[str, int], int] | None:
        """Load the checkpoint into ``learner``; returns its offsets (``None``: no checkpoint).
        State of another family or layout raises :class:`CheckpointError`; state the ledger did
        not pay for raises ``LedgerMismatch``."""
        state = self.load()
        if state is None:
            return None
        try:
            learner.load_state(state, what=f"checkpoint {self.path}")
        except StateMismatch as exc:
            raise CheckpointError(str(exc)) from exc
        return state["offsets"]


class CheckpointHook:
    """The run loop's checkpoint: before the source is committed at some positions, the learner's
    state is written for exactly those positions (:meth:`save`), at most every ``interval_s``
    (:meth:`due`; always for a final commit and before partitions are given up). A skipped
    checkpoint skips its commit too: more records are consumed again after a crash, never one lost."""

    def __init__(self, checkpoint: Checkpoint, interval_s: float = 0.0) -> None:
        self.checkpoint = checkpoint
        self.interval_s = float(interval_s)
        self._last = float("-inf")

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval_s

    def save(self, learner: PrivateLearner, positions: Mapping[tuple[str, int], int]) -> None:
        self.checkpoint.save(learner, positions)
        self._last = time.monotonic()


def attach(app: Application, path: str | os.PathLike[str], interval_s: float = 0.0) -> Checkpoint:
    """Restore ``app``'s learner from the checkpoint at ``path`` (if any), seek the source to its
    offsets and make the run loop checkpoint before every commit (:meth:`Application.checkpoint_with`).

    Call after building the application and before ``run()``. The source must offer
    ``positions()`` and ``seek(offsets)`` (:class:`connectors.kafka.KafkaSource` does).
    """
    if not isinstance(app.source, SeekableSource):
        raise CheckpointError(f"source {type(app.source).__name__} has no positions(), seek() and commit_now(); "
                              "cannot checkpoint offsets")
    ckpt = Checkpoint(path)
    offsets = ckpt.restore(app.learner)
    if offsets is not None:
        app.source.seek(offsets)
        app.restored(offsets)
    app.checkpoint_with(CheckpointHook(ckpt, interval_s))
    return ckpt
