"""Running one family's audit (:class:`~stream_vips.models.auditing.FamilyAudit`, stated by the
family in its module) through the engine: the releases of one side, and a candidate's noiseless
contribution. :mod:`stream_vips.audit.families` collects the families' audits and runs them."""

from __future__ import annotations

from typing import Any

import numpy as np

from stream_vips.audit.release import EngineTrials, parse_record, parse_records
from stream_vips.models.auditing import FamilyAudit as FamilyAudit
from stream_vips.models.base import Model


def trials(spec: FamilyAudit, record: Any | None, seed: int, delta: float = 1e-5) -> EngineTrials:
    """Releases of one side holding ``record`` (a candidate; None: nothing), via the engine."""
    return EngineTrials(spec.make_model, record, capacity=spec.capacity, sampling=spec.sampling,
                        batch_size=spec.batch_size, noise_multiplier=spec.noise_multiplier, seed=seed,
                        delta=delta, unit=spec.unit, records_per_key=spec.records_per_key,
                        block_weights=spec.block_weights)


def contribution(spec: FamilyAudit, model: Model, candidate: Any) -> dict[str, np.ndarray]:
    """The candidate's noiseless clipped contribution: one record's ``clipped_sum``, or one key's
    ``group_clipped_sum`` (its records in one group)."""
    if spec.unit == "key":
        return model.group_clipped_sum(parse_records(model, candidate), np.zeros(len(candidate), np.intp), 1)
    return model.clipped_sum(parse_record(model, candidate))
