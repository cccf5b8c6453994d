"""How one family is audited: :class:`FamilyAudit`, the neighbouring candidates, sampler and noise
of one audit. Each family states its own (:meth:`stream_vips.models.base.Model.audit`, in the
family's module); :mod:`stream_vips.audit.families` collects them and runs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from stream_vips.audit.release import EngineTrials, parse_record, parse_records
from stream_vips.models.base import Model


@dataclass(frozen=True)
class FamilyAudit:
    """How to audit one family: model factory (capacity -> model), candidate records, sampler, z.

    The audited pair is the candidate pair whose noiseless difference is largest in units of the
    engine's noise; ``ratio_floor`` is the least ratio of that pair to the claimed sensitivity,
    with ``floor_reason`` saying why the family cannot reach 1. With ``unit="key"`` a candidate is
    one key's tuple of at most ``records_per_key`` records, ``capacity`` counts key slots, and the
    pair replaces all records of one key.
    """

    family: str
    make_model: Callable[[int], Model]
    candidates: tuple[Any, ...]
    ratio_floor: float  # the audited pair's ratio to the claimed sensitivity is at least this
    floor_reason: str  # one line: why the pair stops there (what keeps it below 1)
    noise_multiplier: float = 3.0
    sampling: str = "fixed"
    capacity: int = 4
    batch_size: int = 4
    note: str = ""
    unit: str = "record"
    records_per_key: int = 1
    block_weights: Mapping[str, float] | None = None  # the engine's allocation; None: the family's default

    def trials(self, record: Any | None, seed: int, delta: float = 1e-5) -> EngineTrials:
        """Releases of one side holding ``record`` (a candidate; None: nothing), via the engine."""
        return EngineTrials(self.make_model, record, capacity=self.capacity, sampling=self.sampling,
                            batch_size=self.batch_size, noise_multiplier=self.noise_multiplier, seed=seed,
                            delta=delta, unit=self.unit, records_per_key=self.records_per_key,
                            block_weights=self.block_weights)

    def contribution(self, model: Model, candidate: Any) -> dict[str, np.ndarray]:
        """The candidate's noiseless clipped contribution: one record's ``clipped_sum``, or one
        key's ``group_clipped_sum`` (its records in one group)."""
        if self.unit == "key":
            return model.group_clipped_sum(parse_records(model, candidate), np.zeros(len(candidate), np.intp), 1)
        return model.clipped_sum(parse_record(model, candidate))
