"""Speed of the sep_bnn private step against a plain numpy PBP/ADF pass over the same minibatches.

Private step: ``clipped_sum`` (PBP moments and per-record sites, vectorised over the batch, clipped)
plus Gaussian noise on the sum and ``update``. Reference: PBP's own ADF, record by record over
the same minibatches (moments, log Z gradients and the ADF update of every weight, numpy, no
clipping or noise). Synthetic data, d = 8, H = 50, batches of 100; min of 3 runs.
Target: private records/s >= 1.0x the ADF pass. Not part of the test suite.

Run: ``python benchmarks/bench_sep_bnn_speed.py``; writes benchmarks/results/bench_sep_bnn_speed.json.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.common import machine, write_result
from stream_vips.models.sep.bnn import BNNSEP, log_z_gradients

D, H, N, S, STEPS, RUNS = 8, 50, 10_000, 100, 50, 3


def adf_pass(model: BNNSEP, X: np.ndarray, y: np.ndarray, batches: list[np.ndarray]) -> None:
    """PBP's ADF: each record updates the weight means and variances in turn."""
    mean, var, a, b = model.posterior()
    mean, var = mean.copy(), var.copy()
    for idx in batches:
        for i in idx:
            g_m, g_v, _ = log_z_gradients(mean, var, X[i : i + 1], y[i : i + 1], b / (a - 1), D, H)
            kappa = g_m[0] ** 2 - 2 * g_v[0]
            new_var = var - var * var * kappa
            if np.all(new_var > 0):
                mean, var = mean + var * g_m[0], new_var


def private_steps(model: BNNSEP, rows: dict, batches: list[np.ndarray], rng: np.random.Generator) -> None:
    for idx in batches:
        s = model.clipped_sum({k: v[idx] for k, v in rows.items()})["site"]
        model.update({"site": (s + rng.normal(0.0, 2.0, s.shape)) / S}, rho=0.05)


def main() -> dict:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, D))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(N)
    batches = [rng.choice(N, S, replace=False) for _ in range(STEPS)]
    rows = {"x": X, "y": y}
    priv, ref = [], []
    for _ in range(RUNS):
        m = BNNSEP(dim=D, hidden=H, dataset_size=N, clip=1.0)
        t0 = time.perf_counter()
        private_steps(m, rows, batches, rng)
        priv.append(time.perf_counter() - t0)
        m = BNNSEP(dim=D, hidden=H, dataset_size=N, clip=1.0)
        t0 = time.perf_counter()
        adf_pass(m, X, y, batches)
        ref.append(time.perf_counter() - t0)
    n = STEPS * S
    result = {
        "what": "sep_bnn private step (clipped_sum + noise + update) vs numpy PBP/ADF record by record",
        "dim": D, "hidden": H, "batch_size": S, "steps": STEPS, "runs": RUNS,
        "private_records_per_s": n / min(priv), "adf_records_per_s": n / min(ref),
        "ratio": min(ref) / min(priv), "target": ">= 1.0", "met": min(ref) / min(priv) >= 1.0,
        "machine": machine(), "load_average": os.getloadavg(),
    }
    write_result("bench_sep_bnn_speed", result)
    return result


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
