"""State files that hold raw records: a nested state (numpy arrays and JSON values) as one .npz
(arrays by their path, the rest as JSON metadata; no pickles), written atomically with mode 0600.

The service's checkpoint and a shard's checkpoint both hold reservoir rows, so both stay behind
the privacy wall: only the process that owns the records reads them. A write goes to a temporary
file that is fsynced, renamed over the target and made durable by an fsync of the directory, so a
crash leaves either the old file or the new one."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def split_arrays(state: Mapping[str, Any], prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Move the numpy arrays of a (nested) ``state`` into ``arrays`` under ``prefix``-ed paths;
    return the JSON rest."""
    rest: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            arrays[f"{prefix}{key}"] = value
        elif isinstance(value, Mapping):
            rest[key] = split_arrays(value, f"{prefix}{key}/", arrays)
        else:
            rest[key] = value
    return rest


def join_arrays(meta: Mapping[str, Any], prefix: str, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Inverse of :func:`split_arrays`."""
    out = {k: (join_arrays(v, f"{prefix}{k}/", arrays) if isinstance(v, dict) else v) for k, v in meta.items()}
    for name, arr in arrays.items():
        if name.startswith(prefix) and "/" not in name[len(prefix):]:
            out[name[len(prefix):]] = arr
    return out


def to_npz(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """``meta`` (JSON) and ``arrays`` as the bytes of one .npz."""
    buf = io.BytesIO()
    payload: dict[str, Any] = {"__meta__": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays}
    np.savez(buf, **payload)
    return buf.getvalue()


def from_npz(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The metadata and the arrays of :func:`to_npz`'s bytes (ValueError, KeyError or OSError when
    they are not such a file)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        meta = json.loads(z["__meta__"].tobytes().decode())
        return meta, {k: z[k] for k in z.files if k != "__meta__"}


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename, fsync of the
    directory), mode 0600 even over a stale temporary file with other bits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
