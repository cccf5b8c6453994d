"""The privacy layer: events, accountants, mechanisms, the budget monitor and ledgers.

Names are imported lazily so that light users (a ledger writer, a reader of events) do not pay
for importing dp_accounting and autodp.
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
