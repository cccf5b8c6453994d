"""The privacy layer: events, accountants, mechanisms, the budget monitor and ledgers.

Names are imported lazily so that light users (a ledger writer, a reader of events) do not pay
for importing dp_accounting and autodp.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the lazy names below, for type checkers
    from stream_vips.privacy.accountants import (
        Accountant,
        PldAccountant,
        RdpAccountant,
        UnsupportedEvent,
        make_accountant,
    )
    from stream_vips.privacy.budget import BudgetMonitor
    from stream_vips.privacy.calibration import calibrate_noise_multiplier
    from stream_vips.privacy.events import SubsampledGaussianEvent, UnknownEvent, event_from_dict
    from stream_vips.privacy.ledger import FileLedger, Ledger, LedgerCorrupt, LedgerLocked, MemoryLedger
    from stream_vips.privacy.mechanisms import (
        block_noise_stds,
        clip_factors,
        clip_rows,
        effective_noise_multiplier,
        gaussian_noise,
        make_rng,
        noise_std,
        project_pd,
        symmetric_noise,
    )

_EXPORTS = {
    "SubsampledGaussianEvent": "events", "event_from_dict": "events", "UnknownEvent": "events",
    "Accountant": "accountants", "PldAccountant": "accountants", "RdpAccountant": "accountants",
    "UnsupportedEvent": "accountants", "make_accountant": "accountants",
    "calibrate_noise_multiplier": "calibration",
    "clip_rows": "mechanisms", "clip_factors": "mechanisms", "gaussian_noise": "mechanisms",
    "symmetric_noise": "mechanisms", "project_pd": "mechanisms", "make_rng": "mechanisms",
    "noise_std": "mechanisms", "block_noise_stds": "mechanisms",
    "effective_noise_multiplier": "mechanisms",
    "BudgetMonitor": "budget",
    "Ledger": "ledger", "MemoryLedger": "ledger", "FileLedger": "ledger", "LedgerCorrupt": "ledger",
    "LedgerLocked": "ledger",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
