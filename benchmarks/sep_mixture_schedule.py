"""Schedules tried for the private mixture in many dimensions, on synthetic data only (not taken).

The rule's SEP schedule makes one site refresh over the run (s T = 1: the noise on the released
natural parameters grows like sqrt(s T)), so the averaged site keeps the early steps, whose
assignments were made from the public start. Two ways to forget them were tried against it:

- more refreshes: s T = 2 and 4 (the damping times 2 and 4; rho_t constant as in the rule);
- step sizes rho_t = (t0 + t)^-1 with damping a, so s_t = a / (t0 + t): the averaged site weights
  step t like (t0 + t)^(a - 1) (later steps more) at about the same noise (a = 2: sum of squared
  weights 4 / (3 T) against the rule's (1 - e^-2) / (2 T) on 0.63 of the weight).

Declared: the synthetic mixtures of benchmarks/sep_mixture_covariance.py (K = 10 in d = 32 and
64, K = 3 in d = 64; N = 3,000; seeds 0-2), the rule's isotropic factor and known spreads, every
other setting the rule's (2,000 steps at q = 0.01), each schedule at epsilon 1 and 3 (delta
1e-5) and without noise at the private schedule's steps. Score: the adjusted Rand index.

Run: ``python benchmarks/sep_mixture_schedule.py`` (about 4 minutes on one core; writes
benchmarks/results/sep_mixture_schedule.json).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

from benchmarks.common import machine, write_result

CASES = ((10, 32), (10, 64), (3, 64))
SEEDS = range(3)
SETTINGS = ("non-private", 1.0, 3.0)
DELTA = 1e-5
Schedule = Callable[[object], object]


def refreshes(times: float) -> Schedule:
    """The rule's schedule with ``times`` site refreshes."""
    return lambda s: dataclasses.replace(s, model_params={**s.model_params,
                                                          "damping": s.model_params["damping"] * times})


def forgetting(a: float, t0: float) -> Schedule:
    """s_t = a / (t0 + t)."""
    return lambda s: dataclasses.replace(s, tau0=t0, kappa=1.0, model_params={**s.model_params, "damping": a})


SCHEDULES: dict[str, Schedule] = {
    "rule (s T = 1)": lambda s: s,
    "s T = 2": refreshes(2.0), "s T = 4": refreshes(4.0),
    "a 2, t0 10": forgetting(2.0, 10.0), "a 2, t0 500": forgetting(2.0, 500.0),
    "a 3, t0 1000": forgetting(3.0, 1000.0),
}


def ari(X: np.ndarray, h: np.ndarray, k: int, seed: int, schedule: Schedule, setting: str | float) -> float:
    from sklearn.metrics import adjusted_rand_score

    import stream_vips as sv
    from stream_vips.models.sep.mixture import MixtureSEP

    n, d = X.shape
    private = MixtureSEP.fit_rule(n, d, 1.0 if setting == "non-private" else float(setting), DELTA, False)
    settings = schedule(private)
    if setting == "non-private":
        settings = dataclasses.replace(settings, epsilon=None)  # the private schedule, without noise
    result = sv.fit(X, "sep_mixture", epsilon=1.0 if setting == "non-private" else float(setting), delta=DELTA,
                    non_private=setting == "non-private", seed=seed, settings=settings, n_components=k,
                    init_seed=1000 + seed)
    return float(adjusted_rand_score(h, result.posterior.model.predict(X)))


def main() -> dict:
    from benchmarks.sep_mixture_covariance import synthetic

    started = time.perf_counter()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, d in CASES:
            data = {seed: synthetic(seed, d, k) for seed in SEEDS}
            row: dict = {"k": k, "d": d}
            for name, schedule in SCHEDULES.items():
                for setting in SETTINGS:
                    scores = [ari(*data[seed], k, seed, schedule, setting) for seed in SEEDS]
                    row[f"{name} | {setting}"] = {"mean": float(np.mean(scores)), "per_seed": scores}
            rows.append(row)
            print(k, d, {m: round(v["mean"], 3) for m, v in row.items() if isinstance(v, dict)}, flush=True)
    result = {
        "benchmark": "sep_mixture_schedule",
        "purpose": "schedules tried for the private mixture in many dimensions (synthetic data only; none taken)",
        "setup": {"generator": "benchmarks/sep_mixture_covariance.py synthetic()", "cases": [list(c) for c in CASES],
                  "seeds": list(SEEDS), "settings": [str(s) for s in SETTINGS], "delta": DELTA,
                  "schedules": list(SCHEDULES),
                  "ours": "sep_mixture through fit with the rule's settings (isotropic factor, known spreads) and "
                          "the schedule changed; non-private runs use the private schedule without noise",
                  "init_seed": "1000 + seed"},
        "rows": rows,
        "seconds": time.perf_counter() - started,
        "machine": machine(),
    }
    write_result("sep_mixture_schedule", result)
    return result


if __name__ == "__main__":
    main()
