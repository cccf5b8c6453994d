"""What the PLD accountant reads of dp_accounting's privacy loss distributions, as protocols (the
library ships no types). Kept apart from :mod:`stream_vips.privacy.accountants.pld`, whose code is
mutation-tested: a new class there would invalidate its recorded result (tools/mutation.py)."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class DensePmf(Protocol):
    """A dense PMF of privacy losses on a grid: the lowest loss index, the probabilities from
    there, and the mass at infinite loss."""

    _lower_loss: int
    _probs: np.ndarray
    _infinity_mass: float


class LossPmf(Protocol):
    """One side of a privacy loss distribution (dense or sparse)."""

    def to_dense_pmf(self) -> DensePmf: ...


class PrivacyLossDistribution(Protocol):
    """A privacy loss distribution: its remove and add sides (the same object when symmetric)."""

    _pmf_remove: LossPmf
    _pmf_add: LossPmf
