"""Speed of one SBN step (E-step + M-step, images/s) against a plain numpy implementation.

The reference does the same non-private stochastic VB update written directly from the formulas
(eqs. 67-71 and the Gaussian M-step): per-image quantities through (n, J, K, K) einsums and the
full <z z^T> tensor, no batched GEMM, no triangle packing, and the same per-record clipping
(one factor per record from each block's norm). Both run on the same images and state, and the
run checks that one step of each leaves the same state.
Target: ratio (ours / reference) >= 1.0. Run: ``python benchmarks/bench_sbn_speed.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np
from scipy.special import expit

from stream_vips.models.logistic import pg_mean
from stream_vips.models.sbn import SigmoidBeliefNetwork

J, K, S, ITERS, REPEATS = 64, 50, 400, 2, 5


def reference_step(m: SigmoidBeliefNetwork, Y: np.ndarray) -> None:
    """Plain numpy: E-step with explicit (n, J, K+1, K+1) tensors over zt = (z, 1) (c_j is the
    weight of a constant unit), then the model's own M-step."""
    mu, cross = m._mu_w, m._cross.astype(float)
    Mt = np.zeros((J, K + 1, K + 1))
    Mt[:, :K, :K], Mt[:, :K, K], Mt[:, K, :K], Mt[:, K, K] = m._M, cross, cross, m._ec2
    n = len(Y)
    pi = np.tile(expit(m._mu_b), (n, 1))
    yh = Y - 0.5
    diagM = np.einsum("jkk->jk", Mt)[:, :K]
    for _ in range(ITERS):
        pt = np.hstack([pi, np.ones((n, 1))])
        zz = np.einsum("nk,nl->nkl", pt, pt)
        zz[:, np.arange(K), np.arange(K)] = pi
        psi2 = np.einsum("njkl,nkl->nj", np.broadcast_to(Mt, (n, J, K + 1, K + 1)), zz)
        xi = pg_mean(np.sqrt(np.maximum(psi2, 0)))
        Mpi = np.einsum("jkl,nl->njk", Mt[:, :K, :K], pi)
        d = m._mu_b + yh @ mu - np.einsum("nj,njk->nk", xi, Mpi - pi[:, None, :] * diagM + cross + 0.5 * diagM)
        pi = (1.0 - m.damping) * pi + m.damping * expit(d)
    zz = np.einsum("nk,nl->nkl", pi, pi)
    zz[:, np.arange(K), np.arange(K)] = pi
    iu = np.triu_indices(K)
    norm = lambda a: np.sqrt((a.reshape(len(a), -1) ** 2).sum(1))  # noqa: E731
    norms = {"z": norm(pi), "y": norm(Y), "xi": norm(xi), "z_y": norm(np.einsum("nj,nk->njk", Y, pi)),
             "xi_zz": norm(xi) * norm(zz[:, iu[0], iu[1]])}
    c = m.clip_bounds()
    f = np.minimum(1.0, np.min([c[k] * (1 - 1e-9) / np.maximum(v, 1e-300) for k, v in norms.items()], axis=0))
    xizz = np.einsum("n,nj,nkl->jkl", f, xi, zz) / n
    means = {"weight": np.array([f.mean()]), "z": f @ pi / n, "y": f @ Y / n, "xi": f @ xi / n,
             "z_y": np.einsum("n,nj,nk->jk", f, Y, pi) / n, "xi_zz": xizz[:, iu[0], iu[1]]}
    m.update(means, 0.5)


def ours_step(m: SigmoidBeliefNetwork, Y: np.ndarray) -> None:
    s = m.clipped_sum({"y": Y})
    m.update({k: v / len(Y) for k, v in s.items()}, 0.5)


def rate(step, dtype: str, Y: np.ndarray) -> float:
    m = SigmoidBeliefNetwork(J, K, 60_000, inner_iterations=ITERS, dtype=dtype)
    step(m, Y)  # warm-up
    best = float("inf")
    for _ in range(REPEATS):
        t = time.perf_counter()
        step(m, Y)
        best = min(best, time.perf_counter() - t)
    return len(Y) / best


def state_difference(Y: np.ndarray) -> float:
    """Largest relative difference between the states after one step of each implementation."""
    a, b = (SigmoidBeliefNetwork(J, K, 60_000, inner_iterations=ITERS) for _ in range(2))
    reference_step(a, Y.astype(float))
    ours_step(b, Y)
    return max(float(np.abs(a.state()[k] - v).max() / max(1.0, np.abs(v).max())) for k, v in b.state().items())


def main() -> None:
    Y = (np.random.default_rng(0).random((S, J)) < 0.2).astype(np.uint8)
    diff = state_difference(Y)
    ref = rate(reference_step, "float64", Y.astype(float))
    ours64 = rate(ours_step, "float64", Y)
    ours32 = rate(ours_step, "float32", Y)
    out = {"benchmark": "bench_sbn_speed", "J": J, "K": K, "S": S, "inner_iterations": ITERS,
           "images_per_s": {"reference_numpy": ref, "ours_float64": ours64, "ours_float32": ours32},
           "peer": "reference_numpy: the same non-private E-step and statistics written directly from the formulas "
                   "with (n, J, K+1, K+1) einsums and the same per-record clipping, then the same M-step; same "
                   "images, same state, best of 5",
           "max_relative_state_difference": diff, "load_average_1min": os.getloadavg()[0],
           "ratio_float64": ours64 / ref, "ratio_float32": ours32 / ref,
           "target": {"ratio": 1.0}, "met": {"ratio": ours64 / ref >= 1.0}}
    path = ROOT / "benchmarks" / "results" / "bench_sbn_speed.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
