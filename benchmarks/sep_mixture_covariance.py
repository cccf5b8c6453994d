"""Evidence for the sep_mixture fit rule's factor and spreads, on synthetic data only.

Why the question arises: a full-covariance factor releases d + d(d+1)/2 numbers per component
(2,144 at d = 64), a diagonal one 2d (128); the noise of the release falls on every one of them,
the precision's eigenvalue floor grows like sqrt(d) times that noise for a full matrix, and a full
factor costs O(d^3) per record and component. The learnt diagonal spreads add J d noisy
statistics whose bound grows like sqrt(d); a spherical spread has J, bounded by b^2.

Declared before any fit: MixtureData (the family's synthetic generator) with K in {3, 10}
components in d in {2, 8, 32, 64}, the means N(0, spread^2 I) with spread = 4 / sqrt(2 d) (two
means are then 4 noise sds apart on average at every d), noise sd 1, N = 3,000, standardised
and clipped to +-3 as benchmarks/bench_estimators.py loads tables; tuning seeds 0-2. Variants,
through the estimator with every other setting at the fit rule's: the full factor with learnt
diagonal spreads (the rule before; at d = 32 seed 0 only and not at d = 64, where a fit takes
minutes), the diagonal factor with learnt diagonal, learnt spherical or known spreads
(``learn_spreads=False``: sd ``noise_sd``, equal weights), and the isotropic factor
(``mean_covariance="spherical"``: d + 1 released numbers per component) with known spreads;
each non-private and at epsilon 1 and 3 (delta 1e-5), K the true number; scikit-learn's
spherical GaussianMixture as the non-private reference. Score: the adjusted Rand index of the training rows.

Run: ``python benchmarks/sep_mixture_covariance.py`` (about 15 minutes on one core; writes
benchmarks/results/sep_mixture_covariance.json).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

from benchmarks.common import machine, write_result

DIMENSIONS = (2, 8, 32, 64)
COMPONENTS = (3, 10)
N = 3000
SEEDS = range(3)
SETTINGS = ("non-private", 1.0, 3.0)
DELTA = 1e-5
#: The variants: the estimator's keywords, and the dimensions where a variant runs on fewer seeds.
VARIANTS = {
    "full factor, diag spreads": ({"mean_covariance": "full", "learn_spreads": True, "spreads": "diag"},
                                  {32: range(1), 64: range(0)}),
    "diag factor, diag spreads": ({"mean_covariance": "diag", "learn_spreads": True, "spreads": "diag"}, {}),
    "diag factor, spherical spreads": ({"mean_covariance": "diag", "learn_spreads": True, "spreads": "spherical"}, {}),
    "diag factor, known spreads": ({"mean_covariance": "diag", "learn_spreads": False}, {}),
    "spherical factor, known spreads": ({"mean_covariance": "spherical", "learn_spreads": False}, {}),
}


def synthetic(seed: int, d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The declared set: standardised, clipped points and their components."""
    from stream_vips.models.sep.mixture import MixtureData

    gen = MixtureData(np.random.default_rng(seed), n_components=k, dimension=d, spread=4.0 / np.sqrt(2 * d),
                      noise_sd=1.0)
    X, h = gen.sample_labelled(N)
    return np.clip((X - X.mean(axis=0)) / X.std(axis=0), -3, 3), h


def ari(X: np.ndarray, h: np.ndarray, k: int, seed: int, keywords: dict, setting: str | float) -> float:
    from sklearn.metrics import adjusted_rand_score

    from stream_vips.estimators import PrivateGaussianMixture

    privacy = {"non_private": True} if setting == "non-private" else {"epsilon": setting, "delta": DELTA}
    gm = PrivateGaussianMixture(n_components=k, random_state=seed, **keywords, **privacy).fit(X)
    return float(adjusted_rand_score(h, gm.labels_))


def reference(X: np.ndarray, h: np.ndarray, k: int, seed: int) -> float:
    from sklearn.metrics import adjusted_rand_score
    from sklearn.mixture import GaussianMixture

    return float(adjusted_rand_score(h, GaussianMixture(k, covariance_type="spherical", random_state=seed)
                                     .fit(X).predict(X)))


def main() -> dict:
    started = time.perf_counter()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for d in DIMENSIONS:
            for k in COMPONENTS:
                data = {seed: synthetic(seed, d, k) for seed in SEEDS}
                ref = [reference(*data[seed], k, seed) for seed in SEEDS]
                row: dict = {"d": d, "k": k, "scikit-learn spherical (non-private)": {"mean": float(np.mean(ref)),
                                                                                     "per_seed": ref}}
                for variant, (keywords, fewer) in VARIANTS.items():
                    seeds = fewer.get(d, SEEDS)
                    for setting in SETTINGS if len(seeds) else ():
                        scores = [ari(*data[seed], k, seed, keywords, setting) for seed in seeds]
                        row[f"{variant} | {setting}"] = {"mean": float(np.mean(scores)), "per_seed": scores}
                rows.append(row)
                print(d, k, {m: round(v["mean"], 3) for m, v in row.items() if isinstance(v, dict)}, flush=True)
    result = {
        "benchmark": "sep_mixture_covariance",
        "purpose": "choose the sep_mixture fit rule's factor and spreads on synthetic data only",
        "setup": {"generator": "MixtureData, spread 4 / sqrt(2 d), noise sd 1, standardised, clipped to +-3",
                  "n": N, "dimensions": list(DIMENSIONS), "components": list(COMPONENTS), "seeds": list(SEEDS),
                  "variants": {name: {"keywords": kw, "fewer_seeds": {str(d): list(r) for d, r in fewer.items()}}
                               for name, (kw, fewer) in VARIANTS.items()},
                  "settings": [str(s) for s in SETTINGS], "delta": DELTA,
                  "ours": "PrivateGaussianMixture, every other setting at the fit rule's",
                  "reference": "sklearn GaussianMixture(K, covariance_type='spherical', random_state=seed), "
                               "non-private"},
        "rows": rows,
        "seconds": time.perf_counter() - started,
        "machine": machine(),
    }
    write_result("sep_mixture_covariance", result)
    return result


if __name__ == "__main__":
    main()
