"""A shard's checkpoint: its reservoir slice, its generators and the source positions they reflect.

With ``runtime.checkpoint_path`` set, shard i of N keeps its own file, the path with
``.shard<i>`` before the extension (:func:`shard_path`). Before the shard commits its source at
some positions it writes, in one file, its reservoir (rows, positions, admission generator), its
sampling generator and those positions; a Ray actor restarted on the same node, or a shard
rebuilt by a restarted driver, loads it and seeks its source to the positions, so it does not
come back empty and every record after them is read again exactly once (privacy rule 14 in
docs/privacy.md). The write is atomic (temporary file, fsync, rename, fsync of the directory) and
the file has mode 0600: it holds raw records, so it stays behind the privacy wall.

Spending is never in a shard's checkpoint: the driver's ledger counts steps and epsilon, so a
restart on the same ledger never spends less. The format is this module's own (the one-process
checkpoint of :mod:`stream_vips.service.checkpoint` also binds the model and the ledger, which a
shard does not hold); both write through :mod:`stream_vips.snapshot`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from stream_vips.errors import StreamVipsError
from stream_vips.snapshot import from_npz, join_arrays, split_arrays, to_npz, write_private

FORMAT = "stream_vips.shard-checkpoint.v1"


class ShardCheckpointError(StreamVipsError, RuntimeError):
    """A shard checkpoint that belongs to another shard or cannot be read."""


def shard_path(path: str | os.PathLike[str], index: int, shards: int) -> Path:
    """Shard ``index``'s file: ``ckpt.npz`` -> ``ckpt.shard<index>.npz`` (as the per-shard files
    of file connectors; a single shard keeps the path)."""
    p = Path(path)
    if shards == 1:
        return p
    return p.with_name(f"{p.stem}.shard{index}{p.suffix}") if p.suffix else p.with_name(f"{p.name}.shard{index}")


def pack(state: Mapping[str, Any]) -> bytes:
    """``{"index", "shards", "reservoir", "rng", "offsets"}`` as one .npz (no pickles)."""
    arrays: dict[str, np.ndarray] = {}
    meta = {"format": FORMAT, "index": state["index"], "shards": state["shards"], "rng": state["rng"],
            "offsets": [[t, p, o] for (t, p), o in sorted(state["offsets"].items())],
            "reservoir": split_arrays(state["reservoir"], "reservoir/", arrays)}
    return to_npz(meta, arrays)


def unpack(data: bytes) -> dict[str, Any]:
    meta, arrays = from_npz(data)
    if meta.get("format") != FORMAT:
        raise ShardCheckpointError(f"format {meta.get('format')!r} is not {FORMAT}")
    return {"index": int(meta["index"]), "shards": int(meta["shards"]), "rng": meta["rng"],
            "offsets": {(t, int(p)): int(o) for t, p, o in meta["offsets"]},
            "reservoir": join_arrays(meta["reservoir"], "reservoir/", arrays)}


class ShardCheckpoint:
    """One shard's checkpoint file, written at most every ``interval_s`` (always when final)."""

    def __init__(self, path: str | os.PathLike[str], interval_s: float = 0.0) -> None:
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self.writes = 0
        self._last = float("-inf")

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval_s

    def save(self, state: Mapping[str, Any]) -> None:
        """Write ``state`` atomically, mode 0600."""
        write_private(self.path, pack(state))
        self.writes += 1
        self._last = time.monotonic()

    def load(self) -> dict[str, Any] | None:
        """The saved state, ``None`` when there is none yet."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ShardCheckpointError(f"shard checkpoint {self.path} cannot be read: {exc.strerror or exc}") from exc
        try:
            return unpack(data)
        except (ValueError, KeyError, OSError) as exc:
            raise ShardCheckpointError(f"shard checkpoint {self.path} cannot be read: {exc}") from exc
