"""Benchmark: the DP-SEP paper's synthetic mixture experiment (section 6.1, Table 1).

Data (per seed): N = 1000 points from J = 4 Gaussians in 4 dimensions, means mu_j ~ N(0, I),
isotropic component sd 0.5, uniform cluster labels. The model is the same conjugate mixture
(mean prior N(0, I), known sd and weights). Ground truth: a long Gibbs run of that model
(labels | means, means | labels), started at the true labels, with Rao-Blackwellised posterior
means and covariances of the component means (the paper used NUTS).

Methods, all through the real engine (full reservoir M = N, Poisson sampling with rate Q, T
steps, rho_t = (TAU0 + t)^-KAPPA): SEP (no clipping, no noise), clipped SEP with C in {1, 10, 20}
(no noise) and DP-SEP with C = 10 (the paper used C = 1) at epsilon in {1, 5, 50}, delta = 1e-5
(PLD accountant, z calibrated with
``calibrate_noise_multiplier`` for T steps; budget monitor + MemoryLedger; the precision
floor follows the public noise level, ``set_noise_scale``). Errors: Frobenius
norm of the difference of the (label-matched) posterior means and covariances against the Gibbs
reference, averaged over 5 seeds, as in the paper's Table 1; the targets use the median over
seeds (SEP on a mixture has local optima; per-seed values are in the JSON).

Targets (the ordering of Table 1), computed from this run:
- DP-SEP error falls as epsilon grows (peer: DP-SEP at epsilon 1, as a ratio);
- clipped SEP error falls as C grows;
- clipped SEP with C = 20 is close to SEP: its excess error over SEP is at most a tenth of the
  excess error of clipped SEP with C = 1 (the peer).

Run: ``python benchmarks/sep_mixture.py`` (writes benchmarks/results/sep_mixture.json and .png).
"""

from __future__ import annotations

import json
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
from scipy.optimize import linear_sum_assignment

from benchmarks.common import RESULTS, machine, write_result
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import PoissonSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.sep.mixture import MixtureSEP
from stream_vips.privacy.accountants import PldAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.calibration import calibrate_noise_multiplier
from stream_vips.privacy.ledger import MemoryLedger

N, J, D, SD = 1000, 4, 4, 0.5
SEEDS = range(5)
DELTA = 1e-5
EPSILONS = (1.0, 5.0, 50.0)
CLIPS = (1.0, 10.0, 20.0)
DP_CLIP = 10.0
Q, T, TAU0, KAPPA = 0.1, 200, 10.0, 0.7
GIBBS_ITERS, GIBBS_BURN = 4000, 500


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + seed)
    means = rng.normal(size=(J, D))
    labels = rng.integers(0, J, N)
    return means[labels] + SD * rng.normal(size=(N, D)), labels


def gibbs_reference(X: np.ndarray, labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rao-Blackwellised posterior means (J, D) and covariances (J, D, D) of the component means."""
    rng = np.random.default_rng(2000 + seed)
    h = labels.copy()
    cond_means, cond_vars = [], []
    for it in range(GIBBS_ITERS):
        counts = np.bincount(h, minlength=J)
        sums = np.stack([np.bincount(h, weights=X[:, k], minlength=J) for k in range(D)], axis=1)
        prec = 1.0 + counts / SD**2
        mean = sums / SD**2 / prec[:, None]
        if it >= GIBBS_BURN:
            cond_means.append(mean)
            cond_vars.append(1.0 / prec)
        mu = mean + rng.normal(size=(J, D)) / np.sqrt(prec)[:, None]
        logp = -0.5 * ((X[:, None, :] - mu[None]) ** 2).sum(-1) / SD**2
        h = np.argmax(logp + rng.gumbel(size=logp.shape), axis=1)
    cm, cv = np.array(cond_means), np.array(cond_vars)
    post_mean = cm.mean(0)
    dev = cm - post_mean
    post_cov = np.einsum("sji,sjk->jik", dev, dev) / len(cm) + cv.mean(0)[:, None, None] * np.eye(D)
    return post_mean, post_cov


def run_sep(X: np.ndarray, clip: float | None, z: float, epsilon: float | None, seed: int,
            accountant: PldAccountant | None = None) -> tuple[np.ndarray, np.ndarray]:
    model = MixtureSEP(n_components=J, dim=D, dataset_size=N, clip=clip, noise_sd=SD, prior_var=1.0, init_seed=seed,
                       learn_spreads=False)  # the paper's model: known sd and weights
    reservoir = Reservoir(model.row_layout(), capacity=N, rng=np.random.default_rng(seed))
    reservoir.add_batch(model.parse_batch([{"x": row} for row in X.tolist()]).rows)
    private = z > 0
    monitor = BudgetMonitor(epsilon, DELTA, accountant or PldAccountant(), MemoryLedger()) if private else None
    engine = PrivateEngine(
        model, reservoir, PoissonSampler(Q), monitor, z, np.random.default_rng(3000 + seed), TAU0, KAPPA, "pld",
        seeded=True, non_private=not private,
    )
    if private:  # the eigenvalue floor follows the public noise level of the released mean
        model.set_noise_scale({k: s / engine.normaliser for k, s in engine.block_stds.items()})
    for _ in range(T):
        if engine.step() is None:
            raise RuntimeError("budget refused a planned step: calibration and budget disagree")
    return model.posterior()


def errors(est: tuple[np.ndarray, np.ndarray], ref: tuple[np.ndarray, np.ndarray]) -> dict:
    mean, cov = est
    rmean, rcov = ref
    row, col = linear_sum_assignment(((mean[:, None] - rmean[None]) ** 2).sum(-1))
    e_mean = float(np.linalg.norm(mean[row] - rmean[col]))
    e_cov = float(np.linalg.norm(cov[row] - rcov[col]))
    return {"mean": e_mean, "cov": e_cov, "average": 0.5 * (e_mean + e_cov)}


def main() -> dict:
    started = time.perf_counter()
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    z_of = {eps: calibrate_noise_multiplier(eps, DELTA, Q, T, "poisson") for eps in EPSILONS}
    methods = {"SEP": (None, 0.0, None)}
    methods.update({f"clipped SEP C={c:g}": (c, 0.0, None) for c in CLIPS})
    methods.update({f"DP-SEP eps={e:g}": (DP_CLIP, z_of[e], e) for e in EPSILONS})
    accountants = {eps: PldAccountant() for eps in EPSILONS}  # one per epsilon: its PLD cache is reused
    per_seed: dict[str, list[dict]] = {name: [] for name in methods}
    for seed in SEEDS:
        X, labels = make_data(seed)
        ref = gibbs_reference(X, labels, seed)
        for name, (clip, z, eps) in methods.items():
            acct = accountants.get(eps)
            per_seed[name].append(errors(run_sep(X, clip, z, eps, seed, acct), ref))
    table = {
        name: {k: float(np.mean([r[k] for r in rows])) for k in ("mean", "cov", "average")}
        | {"median_average": float(np.median([r["average"] for r in rows])),
           "per_seed_average": [r["average"] for r in rows]}
        for name, rows in per_seed.items()
    }
    # Targets on the median over seeds: SEP on a mixture has local optima, and one run that
    # lands in one (visible in per_seed_average) should not decide an ordering on its own.
    avg = {name: row["median_average"] for name, row in table.items()}
    dp = [avg[f"DP-SEP eps={e:g}"] for e in EPSILONS]
    clipped = [avg[f"clipped SEP C={c:g}"] for c in CLIPS]
    excess20 = avg["clipped SEP C=20"] - avg["SEP"]
    excess1 = avg["clipped SEP C=1"] - avg["SEP"]
    targets = {
        "dp_error_falls_with_epsilon": {
            "value": dp, "peer": "DP-SEP eps=1", "ratio_eps50_to_eps1": dp[-1] / dp[0],
            "target": "median average F-norm strictly decreasing over epsilon = 1, 5, 50",
            "met": bool(all(a > b for a, b in zip(dp, dp[1:]))),
        },
        "clipped_error_falls_with_C": {
            "value": clipped, "target": "median average F-norm non-increasing over C = 1, 10, 20 (1% slack)",
            "met": bool(all(a >= b * 0.99 for a, b in zip(clipped, clipped[1:]))),
        },
        "clipped_C20_close_to_SEP": {
            "value": excess20 / excess1, "peer": "clipped SEP C=1 (excess error over SEP, as a ratio)",
            "target": "<= 0.1", "met": bool(excess20 <= 0.1 * excess1),
        },
    }
    result = {
        "benchmark": "sep_mixture",
        "setup": {
            "N": N, "J": J, "dim": D, "component_sd": SD, "prior": "N(0, I)", "seeds": len(SEEDS),
            "sampling": "poisson", "q": Q, "steps": T, "tau0": TAU0, "kappa": KAPPA, "delta": DELTA,
            "dp_clip": DP_CLIP, "accountant": "pld (replace-one)",
            "noise_multipliers": {f"{e:g}": z for e, z in z_of.items()},
            "reference": f"Gibbs, {GIBBS_ITERS} iterations, {GIBBS_BURN} burn-in, Rao-Blackwellised",
        },
        "table": table,
        "paper_table_1": {
            "SEP": 0.0012, "clipped SEP C=20": 0.0134, "clipped SEP C=10": 0.7477, "clipped SEP C=1": 1.1262,
            "DP-SEP eps=50": 1.1385, "DP-SEP eps=5": 6.6139, "DP-SEP eps=1": 44.0262,
        },
        "targets": targets,
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time(),
        "machine": machine(),
    }
    write_result("sep_mixture", result)
    plot(table)
    return result


def plot(table: dict) -> None:
    """Bars: median over seeds of the average F-norm (what the targets use); dots: each seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(x, [table[n]["median_average"] for n in names], 0.6, color="tab:blue", alpha=0.7, label="median of seeds")
    for i, n in enumerate(names):
        seeds = table[n]["per_seed_average"]
        ax.scatter(np.full(len(seeds), i), seeds, color="k", s=12, zorder=3, label="one seed" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("average F-norm vs Gibbs (mean, cov)")
    ax.set_title("DP-SEP mixture of Gaussians (N=1000, J=4, d=4, 5 seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "sep_mixture.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
