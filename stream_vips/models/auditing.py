"""How one family is audited, as data: :class:`FamilyAudit`, the neighbouring candidates,
sampler and noise of one audit. Each family states its own (:meth:`stream_vips.models.base.Model.audit`,
in the family's module); :mod:`stream_vips.audit` runs it through the engine
(:func:`stream_vips.audit.spec.trials`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
