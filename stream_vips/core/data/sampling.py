"""Minibatch samplers over a full reservoir, with the public normaliser of each scheme.

Two schemes, both drawing a fresh batch independently at every step (never shuffle-and-iterate):

- :class:`PoissonSampler` (the default): every reservoir slot joins the batch independently with
  probability q. The noisy sum is divided by the public constant ``q * M`` (privacy rule 4 in
  docs/privacy.md), never by the realised batch size, which is private.
- :class:`FixedSizeSampler`: exactly S distinct slots, uniformly without replacement; rate
  ``q = S / M`` and normaliser S (privacy rule 3 in docs/privacy.md).

Both refuse to sample before the reservoir is full (privacy rule 5 in docs/privacy.md): the
amplification rate q is computed for a reservoir of exactly M records.

>>> import numpy as np
>>> s = FixedSizeSampler(4)
>>> s.sample(10, np.random.default_rng(0), capacity=10).size, s.normaliser(10), s.rate(10)
(4, 4.0, 0.4)
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from stream_vips.errors import ReservoirNotFull


def _check_full(reservoir_size: int, capacity: int) -> None:
    if capacity < 1:
        raise ValueError(f"reservoir capacity must be positive, got {capacity}")
    if reservoir_size != capacity:
        raise ReservoirNotFull(
            f"reservoir holds {reservoir_size} of {capacity} records; no batch is drawn "
            "and nothing is released until it is full"
        )


class FixedSizeSampler:
    """S slots uniformly without replacement, independently at each step."""

    name: ClassVar[str] = "fixed"

    def __init__(self, batch_size: int) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"sampling batch_size must be a positive integer, got {batch_size!r}")
        self.batch_size = int(batch_size)

    def _check_capacity(self, capacity: int) -> None:
        if self.batch_size > capacity:
            raise ValueError(
                f"sampling batch_size {self.batch_size} exceeds the reservoir capacity {capacity}"
            )

    def rate(self, capacity: int) -> float:
        """q = S / M."""
        self._check_capacity(capacity)
        return self.batch_size / capacity

    def normaliser(self, capacity: int) -> float:
        """S: the batch size is public and fixed."""
        self._check_capacity(capacity)
        return float(self.batch_size)

    def sample(self, reservoir_size: int, rng: np.random.Generator, *, capacity: int) -> np.ndarray:
        """Sorted slot indices of one batch (exactly S distinct)."""
        _check_full(reservoir_size, capacity)
        self._check_capacity(capacity)
        idx = rng.choice(capacity, size=self.batch_size, replace=False)
        idx.sort()
        return idx


class PoissonSampler:
    """Each slot independently with probability q."""

    name: ClassVar[str] = "poisson"

    def __init__(self, rate: float) -> None:
        q = float(rate)
        if not (0.0 < q <= 1.0):
            raise ValueError(f"Poisson sampling rate must be in (0, 1], got {rate!r}")
        self.q = q

    def rate(self, capacity: int) -> float:
        """q, fixed at construction."""
        return self.q

    def normaliser(self, capacity: int) -> float:
        """q * M: the expected batch size, a public constant (privacy rule 4 in docs/privacy.md)."""
        return self.q * capacity

    def sample(self, reservoir_size: int, rng: np.random.Generator, *, capacity: int) -> np.ndarray:
        """Sorted slot indices of one batch (Binomial(M, q) many)."""
        _check_full(reservoir_size, capacity)
        return np.flatnonzero(rng.random(capacity) < self.q)


Sampler = FixedSizeSampler | PoissonSampler


def make_sampler(method: str, batch_size: int, capacity: int) -> Sampler:
    """Sampler from configuration: ``batch_size`` is S (fixed) or the expected size q*M (poisson)."""
    if method == "fixed":
        sampler: Sampler = FixedSizeSampler(batch_size)
        sampler.rate(capacity)  # validates S <= M at start
        return sampler
    if method == "poisson":
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or not 0 < batch_size <= capacity:
            raise ValueError(
                f"sampling batch_size must be an integer in [1, reservoir={capacity}], got {batch_size!r}"
            )
        return PoissonSampler(batch_size / capacity)
    raise ValueError(f"sampling method must be 'poisson' or 'fixed', got {method!r}")
