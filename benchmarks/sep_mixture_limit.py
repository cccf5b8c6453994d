"""Where the private mixture's gap to its non-private fit comes from: the noise or the search.

A diagnostic, not a setting: nothing here chooses a default. The fit rule's mixture is run
twice on each data set, from its own public start (means drawn from the prior with
``init_seed``) and from an oracle start, the true groups' means, which no private fit may use
(they come from the labels). If the oracle start closes the gap, the search (the early steps'
assignments, which the one site refresh of the private schedule keeps in its average) is what
loses; if it does not, the noise on the released means does, whatever the start.

Data: the synthetic mixture of benchmarks/sep_mixture_covariance.py at K = 10, d = 64 (tuning
seeds 0-2) and scikit-learn's digits as benchmarks/bench_estimators.py loads it (N 1,797, d 64,
10 groups, standardised and clipped to +-3). Ours through the estimator, every setting the fit
rule's, non-private and at epsilon 1 and 3 (delta 1e-5), seeds 0-2. Score: the adjusted Rand
index of the rows. With each fit the released means' distance to the nearest true mean (median
over components) and the noise's predicted share of it: sqrt(d) times the std of the noise on
one released coordinate of N theta_f (z sqrt(s / (2 - s)) / q, public: the fit's z, rate and
step) over the component's released precision.

Run: ``python benchmarks/sep_mixture_limit.py`` (about 2 minutes on one core; writes
benchmarks/results/sep_mixture_limit.json).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

from benchmarks.common import machine, write_result

SEEDS = range(3)
SETTINGS = ("non-private", 1.0, 3.0)
DELTA = 1e-5


@contextlib.contextmanager
def oracle_start(means: np.ndarray | None) -> Iterator[None]:
    """Start every mixture built inside at ``means`` (the oracle; ``None``: the model's own start)."""
    from stream_vips.models.sep.mixture import MixtureSEP

    build = MixtureSEP.__init__

    @functools.wraps(build)
    def started(self: MixtureSEP, **kwargs: object) -> None:
        build(self, **kwargs)
        if means is not None:
            self._set_posterior(means / self.prior_var, self.prior_precision())

    MixtureSEP.__init__ = started  # type: ignore[method-assign]
    try:
        yield
    finally:
        MixtureSEP.__init__ = build  # type: ignore[method-assign]


def data_sets() -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    from benchmarks.bench_estimators import load
    from benchmarks.sep_mixture_covariance import synthetic

    X, _, labels, _ = load("digits")
    return {"synthetic K 10, d 64": [synthetic(seed, 64, 10) for seed in SEEDS],
            "digits": [(X, np.asarray(labels))] * len(SEEDS)}


def one_fit(X: np.ndarray, h: np.ndarray, seed: int, setting: str | float, start: str) -> dict:
    from sklearn.metrics import adjusted_rand_score

    from stream_vips.estimators import PrivateGaussianMixture

    k = len(np.unique(h))
    true = np.stack([X[h == j].mean(axis=0) for j in np.unique(h)])
    privacy = {"non_private": True} if setting == "non-private" else {"epsilon": setting, "delta": DELTA}
    with oracle_start(true if start == "oracle" else None):
        gm = PrivateGaussianMixture(n_components=k, random_state=seed, **privacy).fit(X)
    model, report = gm.model_, gm.privacy_report_
    eta, prec = model.natural_parameters()
    means = eta / prec
    distance = np.sqrt(((means[:, None] - true[None]) ** 2).sum(axis=-1)).min(axis=1)
    out = {"ari": float(adjusted_rand_score(h, gm.labels_)), "distance": float(np.median(distance))}
    if setting != "non-private":
        settings = report["settings"]
        z, q = report["privacy"]["noise_multiplier"], settings["q"]
        s = min(1.0, model.step_fraction((settings["tau0"]) ** -settings["kappa"]))
        sd = z * np.sqrt(s / (2.0 - s)) / q
        out["predicted_noise"] = float(np.median(np.sqrt(X.shape[1]) * sd / prec.mean(axis=1)))
    return out


def main() -> dict:
    started = time.perf_counter()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, sets in data_sets().items():
            X0, h0 = sets[0]
            true = np.stack([X0[h0 == j].mean(axis=0) for j in np.unique(h0)])
            gaps = np.sqrt(((true[:, None] - true[None]) ** 2).sum(axis=-1))
            row: dict = {"data": name, "n": int(len(X0)), "d": int(X0.shape[1]),
                         "nearest_true_means": float(np.median(np.where(gaps > 0, gaps, np.inf).min(axis=1)))}
            for start in ("public", "oracle"):
                for setting in SETTINGS:
                    fits = [one_fit(*sets[seed], seed, setting, start) for seed in SEEDS]
                    row[f"{start} | {setting}"] = {key: float(np.mean([f[key] for f in fits])) for key in fits[0]} | {
                        "ari_per_seed": [f["ari"] for f in fits]}
            rows.append(row)
            print(name, {m: round(v["ari"], 3) for m, v in row.items() if isinstance(v, dict)}, flush=True)
    result = {
        "benchmark": "sep_mixture_limit",
        "purpose": "diagnostic: whether the private mixture's gap to non-private is the noise or the search "
                   "(the oracle start uses the labels and is never a setting)",
        "setup": {"data": [row["data"] for row in rows], "seeds": list(SEEDS),
                  "settings": [str(s) for s in SETTINGS], "delta": DELTA,
                  "ours": "PrivateGaussianMixture, every setting the fit rule's",
                  "starts": {"public": "the model's start: means drawn from the prior with init_seed",
                             "oracle": "the true groups' means (from the labels; a diagnostic only)"},
                  "distance": "median over components of the released mean's distance to the nearest true mean",
                  "predicted_noise": "median over components of sqrt(d) z sqrt(s / (2 - s)) / q over the "
                                     "component's mean released precision: the noise's share of that distance",
                  "nearest_true_means": "median over groups of the distance to the nearest other group's mean"},
        "rows": rows,
        "seconds": time.perf_counter() - started,
        "machine": machine(),
    }
    write_result("sep_mixture_limit", result)
    return result


if __name__ == "__main__":
    main()
