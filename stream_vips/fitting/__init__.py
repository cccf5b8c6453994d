"""``fit``: private Bayesian inference on a finite data set, spending the whole budget.

A stream service keeps a bounded reservoir and waits for records that keep arriving; a finite
data set has all its records at once. Under replace-one adjacency the number of records N is
public (privacy rule 1 in docs/privacy.md), so the whole data set can be the reservoir
(M = N) and every setting can be chosen from public quantities only: N, the dimension d, the
family, epsilon and delta. :func:`fit_settings` is that rule (derived in docs/fit.md from
synthetic data; never from the accuracy of the data being fitted), :func:`fit` runs the
pipeline once over the data with those settings, calibrates the noise multiplier so that the
planned steps spend the whole budget (up to the calibration tolerance) and returns the final
model message, its posterior and a report of what was spent and why each setting was chosen.

``non_private=True`` is the baseline without noise: its message says ``"private": false`` and
carries ``epsilon_spent: null`` (no guarantee, and no made-up number).

>>> import numpy as np
>>> from stream_vips.fitting import fit
>>> rng = np.random.default_rng(0)
>>> X = np.hstack([rng.uniform(-0.5, 0.5, (2000, 2)), np.full((2000, 1), 0.5)])
>>> y = (X @ np.array([3.0, -2.0, 0.2]) + 0.3 * rng.logistic(size=2000) > 0).astype(float)
>>> result = fit((X, y), "logistic", epsilon=1.0, delta=1e-5, seed=0)
>>> result.report["privacy"]["epsilon_spent"] <= 1.0 < result.report["privacy"]["epsilon_spent"] * 1.01
True
>>> result.settings.steps, result.settings.q
(2, 1.0)
>>> baseline = fit((X, y), "logistic", non_private=True, seed=0)
>>> baseline.message["privacy"]["private"], baseline.message["privacy"]["epsilon_spent"]
(False, None)
>>> p = result.posterior.model.predict_proba(np.array([[0.5, -0.5, 0.5]]))
>>> bool(p[0] > 0.9)
True

Command line: ``stream-vips fit --family logistic --dim 3 --epsilon 1 --delta 1e-5 --out
model.json data.jsonl`` (``--non-private`` for the baseline); see ``stream-vips fit --help``.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (loaded on first use, so a command's help never
#: imports the models); the logistic rule's constants live with the family
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["FitResult", "FitStats", "FitWarning", "LedgerRefused", "NoModelError", "SpentError", "fit",
                     "fit_warnings", "summary"], f"{__name__}.api"),
    **dict.fromkeys(["UNENCODABLE_RECORD", "encode_records", "resolve_dim"], f"{__name__}.data"),
    **dict.fromkeys(["CALIBRATION_RTOL", "CLI_NAMES", "FAMILIES", "MAX_DIM", "PYTHON_NAMES", "RULES", "RULE_VERSION",
                     "Settings", "accountant_for", "calibration_rtol", "check_public", "fit_settings", "overridden"],
                    f"{__name__}.rules"),
    **dict.fromkeys(["CENTRED_LOGISTIC", "CENTRED_MIN_D", "CENTRED_MIN_N", "LOGISTIC_FLOOR_FACTOR", "LOGISTIC_KAPPA",
                     "LOGISTIC_STEPS", "LOGISTIC_WEIGHTS", "NON_PRIVATE_KAPPA", "NON_PRIVATE_LOGISTIC_STEPS",
                     "centred_by_size", "centred_logistic", "logistic_rule_summary"], "stream_vips.models.logistic"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
