"""Decoding and validation of polled batches, in the pipeline's process or in a worker process.

Turning one poll's bytes into reservoir rows (JSON decoding, then the model's field checks and
preprocessing) is a pure function of the bytes and the model's public hyperparameters. It costs
a few microseconds per small record, about a third of what kafka-python's pure-Python record
parsing costs, and the GIL keeps a thread from overlapping the two. :class:`ProcessDecoder`
moves it into one worker process (``runtime.decode_workers: 1``) so that it runs while the
pipeline polls the next batch; :class:`InlineDecoder` does it in place (the default, and the
only sensible choice for the in-memory sources).

Both keep submission order, and both decode with an identically constructed model, so a seeded
run gives the same rows either way (LDA's token subsampling draws from the model's own seeded
generator, which then lives in the worker). Rows never carry anything back but arrays, reason
codes and details; the privacy mechanisms, the reservoir and the RNGs stay in the pipeline.

>>> from stream_vips.models.linreg import LinearRegression
>>> decoder = InlineDecoder(LinearRegression(dim=1, dataset_size=10))
>>> decoder.submit([b'{"x": [0.5], "y": 1}', b"nope", b'{"x": [2], "y": 0}'])
>>> batch = decoder.result()
>>> batch.ok.tolist(), batch.rows["y"].tolist(), [reason for _, reason, _ in batch.rejected]
([True, False, True], [1.0, 0.0], ['invalid_json'])
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from stream_vips import records
from stream_vips.errors import StreamVipsError
from stream_vips.models.base import Model
from stream_vips.records import RawRecord


class DecoderError(StreamVipsError, RuntimeError):
    """The decode worker failed or exited; the run stops rather than skip records."""


@dataclass
class DecodedBatch:
    """One poll's records after decoding and validation.

    ``ok[i]``: arrival ``i`` was accepted; ``rows``: one array per reservoir column holding the
    accepted arrivals in order; ``rejected``: ``(arrival, reason, detail)`` sorted by arrival;
    ``skipped``: arrivals never decoded because the reservoir did not admit them
    (``sampling.validation: admitted``, :meth:`PrivateLearner.offer_raw`; ``rows`` is then empty).
    """

    ok: np.ndarray
    rows: dict[str, np.ndarray]
    rejected: list[tuple[int, str, str]]
    skipped: int = 0


def decode_batch(model: Model, values: Sequence[RawRecord]) -> DecodedBatch:
    """Decode JSON and validate with ``model.parse_batch``; rejection positions are arrivals."""
    decoded = records.decode_json(values)
    parsed = model.parse_batch(decoded.values)
    index = np.asarray(decoded.index, dtype=np.intp)
    rejected = list(decoded.rejected) + [(int(index[i]), reason, detail) for i, reason, detail in parsed.rejected]
    ok = np.zeros(len(values), dtype=bool)
    ok[index[np.asarray(parsed.accepted, dtype=np.intp)]] = True
    return DecodedBatch(ok, parsed.rows, sorted(rejected))


class Decoder(Protocol):
    """Decodes polled batches, in order: ``submit`` one, ``result`` the oldest (``None`` when
    decoding is left to the learner). ``overlaps``: the next batch is polled while one decodes."""

    overlaps: bool

    def submit(self, values: Sequence[bytes]) -> None: ...

    def result(self) -> DecodedBatch | None: ...

    def close(self) -> None: ...


class InlineDecoder:
    """Decodes in the calling process when the result is asked for."""

    overlaps = False

    def __init__(self, model: Model) -> None:
        self.model = model
        self._queue: collections.deque[Sequence[bytes]] = collections.deque()

    def submit(self, values: Sequence[bytes]) -> None:
        self._queue.append(values)

    def result(self) -> DecodedBatch:
        """The oldest submitted batch, decoded."""
        return decode_batch(self.model, self._queue.popleft())

    def close(self) -> None:
        self._queue.clear()


class DeferredDecoder:
    """``sampling.validation: admitted``: nothing is decoded ahead; the learner decodes the
    arrivals its reservoir admits when the batch is applied (:meth:`PrivateLearner.offer_raw`),
    so :meth:`result` is ``None``."""

    overlaps = False

    def __init__(self) -> None:
        self._pending = 0

    def submit(self, values: Sequence[bytes]) -> None:
        self._pending += 1

    def result(self) -> None:
        if not self._pending:
            raise DecoderError("no batch was submitted")
        self._pending -= 1

    def close(self) -> None:
        self._pending = 0


def _serve(conn: Connection) -> None:
    """The worker: receive the model's family and parameters, build it, then decode batches
    until the pipeline closes the socket."""
    from stream_vips.models import model_class

    for sig in (signal.SIGINT, signal.SIGTERM):  # the pipeline drains and closes the socket itself
        signal.signal(sig, signal.SIG_IGN)
    family, params = conn.recv()
    try:
        model = model_class(family)(**params)
    except Exception as exc:
        conn.send(("error", f"building the {family} model failed: {exc!r}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            values = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", decode_batch(model, values)))
        except Exception as exc:  # a bug in a parser: report it rather than die silently
            conn.send(("error", f"decoding a batch of {len(values)} records failed: {exc!r}"))


class ProcessDecoder:
    """Decodes in one worker process, ``python -m stream_vips.core.data.decoding``, over a socket pair.

    A fresh interpreter rather than :mod:`multiprocessing`: it inherits no threads or client
    sockets, and it does not re-run the caller's ``__main__`` script (as ``spawn`` would, which
    breaks scripts without a main guard). :meth:`submit` sends a batch and returns at once;
    :meth:`result` waits for the oldest one. The worker builds its own model from ``family`` and
    ``params`` (the pipeline's configuration; a failure there is raised by the first
    :meth:`result`, so start-up overlaps the pipeline's), ignores SIGINT/SIGTERM (the pipeline
    drains it on shutdown) and exits when the socket closes, so also when the pipeline dies.
    """

    overlaps = True

    def __init__(self, family: str, params: Mapping[str, Any], start_timeout_s: float = 120.0) -> None:
        self.start_timeout_s = float(start_timeout_s)
        ours, theirs = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "stream_vips.core.data.decoding", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        self._conn = Connection(ours.detach())
        self._pending = 0
        self._started = False  # the worker's start-up (imports, model) overlaps the first poll
        self._conn.send((family, dict(params)))

    def submit(self, values: Sequence[bytes]) -> None:
        try:
            self._conn.send(list(values))
        except (OSError, ValueError) as exc:
            raise DecoderError(f"decode worker is gone: {exc}") from exc
        self._pending += 1

    def result(self) -> DecodedBatch:
        """The oldest submitted batch, decoded (waits for the worker)."""
        if not self._pending:
            raise DecoderError("no batch was submitted")
        if not self._started:
            kind, detail = self._receive(self.start_timeout_s)
            if kind != "ready":
                raise DecoderError(detail)
            self._started = True
        kind, payload = self._receive(None)
        self._pending -= 1
        if kind != "ok":
            raise DecoderError(payload)
        return payload

    def _receive(self, timeout_s: float | None) -> tuple[str, Any]:
        waited = 0.0
        while not self._conn.poll(1.0):
            waited += 1.0
            if self._proc.poll() is not None:
                raise DecoderError(f"decode worker exited with code {self._proc.returncode}")
            if timeout_s is not None and waited >= timeout_s:
                raise DecoderError(f"decode worker did not answer within {timeout_s:g} s")
        try:
            return self._conn.recv()
        except EOFError as exc:
            raise DecoderError(f"decode worker exited with code {self._proc.wait(5)}") from exc

    def close(self) -> None:
        """Close the socket (the worker exits) and reap the process."""
        self._conn.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._pending = 0


def make_decoder(workers: int, model: Model, family: str, params: Mapping[str, Any],
                 validation: str = "all") -> Decoder:
    """``workers`` 0: decode inline with ``model``; 1: in a worker building its own model;
    ``validation: admitted`` (``workers`` 0 only): decode nothing ahead (:class:`DeferredDecoder`)."""
    if validation == "admitted":
        if workers != 0:
            raise ValueError("validation admitted decodes when the reservoir admits a record: decode_workers must be 0")
        return DeferredDecoder()
    if workers == 0:
        return InlineDecoder(model)
    if workers == 1:
        return ProcessDecoder(family, params)
    raise ValueError(f"decode_workers must be 0 or 1, got {workers}")


if __name__ == "__main__":  # the worker: classes must pickle as stream_vips.core.data.decoding, not __main__
    from stream_vips.core.data.decoding import _serve as serve

    serve(Connection(int(sys.argv[1])))
