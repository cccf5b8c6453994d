"""Synthetic linear-regression records for demos, tests and benchmarks.

Each record is ``{"x": [x_1..x_d], "y": y}`` with ``x ~ N(0, (x_scale^2 / d) I)`` (so that
``E|x|^2 = x_scale^2``) and ``y = x . w + noise_std * e``, ``e ~ N(0, 1)``. A fraction of the
records can be replaced by malformed ones, cycling through the kinds in :data:`MALFORMED_KINDS`,
so a demo shows the dead-letter path.

>>> src = SyntheticRegressionSource(count=3, dimension=2, seed=0)
>>> [len(r.value) > 0 for r in src.poll(10, 0.0)], src.exhausted
([True, True, True], True)
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from connectors._lines import PausableSource
from stream_vips.io import RawRecord

#: Malformed record generators: kind -> template (``{d}`` is the dimension).
MALFORMED_KINDS: dict[str, str] = {
    "bad_json": '{"x": [0.1, 0.2',
    "nan": '{"x": [NaN%s], "y": 0.5}',
    "wrong_shape": '{"x": [0.1%s, 0.1], "y": 0.5}',
    "huge": '{"x": [1e400%s], "y": 0.5}',
    "wrong_type": '{"x": "not a vector", "y": 0.5}',
    "not_object": "[1, 2, 3]",
}


def _fill(template: str, dimension: int) -> str:
    return template % (", 0.1" * (dimension - 1)) if "%s" in template else template


class SyntheticRegressionSource(PausableSource):
    """Generates ``count`` records (``None``: unbounded) from a fixed linear model.

    ``weights`` default to ``N(0, I)`` draws from ``seed``; ``records_per_second`` throttles
    the stream (``None``: as fast as polled).
    """

    def __init__(
        self,
        count: int | None = None,
        dimension: int = 5,
        weights: Sequence[float] | None = None,
        noise_std: float = 0.1,
        x_scale: float = 0.5,
        seed: int = 0,
        malformed_fraction: float = 0.0,
        records_per_second: float | None = None,
    ) -> None:
        if count is not None and int(count) < 0:
            raise ValueError(f"count must be >= 0 or null, got {count}")
        if int(dimension) < 1:
            raise ValueError(f"dimension must be >= 1, got {dimension}")
        if not 0.0 <= float(malformed_fraction) <= 1.0:
            raise ValueError(f"malformed_fraction must be in [0, 1], got {malformed_fraction}")
        if float(noise_std) < 0 or float(x_scale) <= 0:
            raise ValueError("noise_std must be >= 0 and x_scale > 0")
        if records_per_second is not None and float(records_per_second) <= 0:
            raise ValueError(f"records_per_second must be > 0 or null, got {records_per_second}")
        self.count = None if count is None else int(count)
        self.dimension = int(dimension)
        self._rng = np.random.default_rng(seed)
        if weights is None:
            self.weights = self._rng.standard_normal(self.dimension)
        else:
            self.weights = np.asarray(weights, dtype=float)
            if self.weights.shape != (self.dimension,):
                raise ValueError(f"weights must have length {self.dimension}, got {self.weights.shape}")
        self.noise_std = float(noise_std)
        self.x_scale = float(x_scale)
        self.malformed_fraction = float(malformed_fraction)
        self.records_per_second = None if records_per_second is None else float(records_per_second)
        self._malformed = [_fill(t, self.dimension).encode() for t in MALFORMED_KINDS.values()]
        self._produced = 0
        self._started = time.monotonic()

    def generate(self, n: int) -> list[bytes]:
        """The next ``n`` records as JSON lines (advances the generator)."""
        x = self._rng.standard_normal((n, self.dimension)) * (self.x_scale / np.sqrt(self.dimension))
        y = x @ self.weights + self.noise_std * self._rng.standard_normal(n)
        lines = [
            b'{"x": [%s], "y": %r}' % (", ".join(map(repr, row)).encode(), yi)
            for row, yi in zip(x.tolist(), y.tolist())
        ]
        if self.malformed_fraction > 0:
            bad = np.flatnonzero(self._rng.random(n) < self.malformed_fraction)
            for j, i in enumerate(bad.tolist()):
                lines[i] = self._malformed[(self._produced + j) % len(self._malformed)]
        self._produced += n
        return lines

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        if self.paused or self.exhausted:
            return []
        n = max_records
        if self.count is not None:
            n = min(n, self.count - self._produced)
        if self.records_per_second is not None:
            due = int((time.monotonic() - self._started) * self.records_per_second) - self._produced
            if due <= 0:
                time.sleep(min(timeout_s, 1.0 / self.records_per_second))
                due = int((time.monotonic() - self._started) * self.records_per_second) - self._produced
            n = max(0, min(n, due))
        start = self._produced
        return [RawRecord(v, {"offset": start + i}) for i, v in enumerate(self.generate(n))]

    def commit(self) -> None:
        """A generator has nothing to commit."""

    @property
    def exhausted(self) -> bool:
        return self.count is not None and self._produced >= self.count

    def close(self) -> None:
        """Nothing to release."""
