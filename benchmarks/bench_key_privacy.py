"""Privacy per person (privacy rule 12): key-level against record-level with group privacy.

Streams where each person (key) sends a heavy-tailed number of events: synthetic logistic data
and the UCI Adult rows grouped into synthetic people. Counts per person are drawn as
``ceil(Pareto(alpha))`` capped at ``MAX_EVENTS``; the arrival order interleaves everyone's events
at random. Three private runs of the logistic family, each at delta = 1e-5:

* ``key``: ``privacy.unit: key``, epsilon 1 **per person** (every person, whatever their count);
* ``record``: record-level, epsilon 1 **per record**: a person with k records is protected only at
  the group-privacy bound (k epsilon, k e^((k - 1) epsilon) delta), so this is not a per-person
  guarantee at all (it is shown as the utility record-level buys with the weaker guarantee);
* ``record_group``: record-level at the epsilon that gives the same per-person protection as
  ``key`` by group privacy for the heaviest person (k_max records): epsilon 1 / k_max per record
  with delta 1e-5 / (k_max e), so (1, 1e-5) per person. ``record_group_p99`` does the same for
  the 99th percentile of the counts (it leaves the heaviest 1% of people less protected).

Memory is the same in all runs (the key reservoir holds K slots x L records = M records), and so
is the sampling rate q; the schedule is one update per ``EVERY`` arrivals, with planned steps set
to the steps each run actually takes. Utility: held-out log loss and AUC of the posterior
predictive, mean over seeds, next to the non-private fit on the same reservoir scheme.

    python3 benchmarks/bench_key_privacy.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine, write_result
from stream_vips import PrivateLearner
from stream_vips.models.logistic import log_loss, roc_auc

DELTA = 1e-5
EPSILON = 1.0
ALPHA = 1.2  # Pareto tail of events per person (mean about 1 + 1/(alpha - 1) before the cap)
MAX_EVENTS = 1000
EVERY = 200


def people(n: int, rng: np.random.Generator) -> np.ndarray:
    """A key per arrival: heavy-tailed counts per person, arrivals in random order."""
    counts: list[int] = []
    while sum(counts) < n:
        counts.append(int(min(MAX_EVENTS, math.ceil(rng.pareto(ALPHA) + 1e-12))))
    keys = np.repeat(np.arange(len(counts)), counts)[:n]
    return keys[rng.permutation(n)]


def synthetic(n: int, n_test: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Logistic data: x on the unit sphere's interior (bias last), y ~ Bernoulli(sigmoid(4 w.x))."""
    w = rng.normal(size=d)
    w /= np.linalg.norm(w)

    def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
        X = rng.normal(size=(m, d)) / math.sqrt(d)
        X[:, -1] = 0.5
        X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
        y = (rng.random(m) < 1.0 / (1.0 + np.exp(-4.0 * X @ w))).astype(float)
        return X, y

    return (*draw(n), *draw(n_test))


def first_step_position(keys: np.ndarray | None, capacity: int) -> int:
    """Arrival count at which the first update happens (public: positions and keys only)."""
    if keys is None:
        return max(capacity, EVERY)
    first = np.sort(np.unique(keys, return_index=True)[1])
    filled = int(first[capacity - 1]) + 1  # the K-th distinct key's first arrival
    return int(math.ceil(filled / EVERY) * EVERY)


def run(X: np.ndarray, y: np.ndarray, Xt: np.ndarray, yt: np.ndarray, keys: np.ndarray, *, unit: str,
        epsilon: float, delta: float, memory: int, per_key: int, q: float, seed: int,
        non_private: bool = False) -> dict[str, Any]:
    """One run of the learner over the whole stream; held-out log loss and AUC."""
    capacity = memory // per_key if unit == "key" else memory
    start = first_step_position(keys if unit == "key" else None, capacity)
    steps = 1 + (X.shape[0] - start) // EVERY
    opts: dict[str, Any] = dict(dim=X.shape[1], reservoir=capacity, batch_size=max(1, int(round(q * capacity))),
                                every_records=EVERY, planned_steps=steps, seed=seed, epsilon=epsilon, delta=delta)
    if unit == "key":
        opts.update(unit="key", max_records_per_key=per_key)
    if non_private:
        opts.update(non_private=True)
        opts.pop("epsilon")
    learner = PrivateLearner("logistic", **opts)
    recs = [{"x": a, "y": int(b)} for a, b in zip(X.tolist(), y.tolist())]
    for lo in range(0, len(recs), 5000):
        learner.feed(recs[lo:lo + 5000], keys=keys[lo:lo + 5000] if unit == "key" else None)
    p = learner.posterior.model.predict_proba(Xt)
    return {"log_loss": log_loss(yt, p), "auc": roc_auc(yt, p), "steps": learner.steps_taken,
            "noise_multiplier": learner.engine.noise_multiplier, "epsilon_spent": learner.epsilon_spent}


def compare(name: str, X, y, Xt, yt, seeds: list[int], memory: int, q: float, per_keys: list[int]) -> dict[str, Any]:
    """All configurations on one data set, mean and spread over seeds."""
    rows: dict[str, list[dict[str, Any]]] = {}
    info: dict[str, Any] = {}
    for seed in seeds:
        rng = np.random.default_rng(1000 + seed)
        keys = people(X.shape[0], rng)
        counts = np.bincount(keys)
        k_max, k_99 = int(counts.max()), int(np.ceil(np.quantile(counts, 0.99)))
        info.setdefault("people", []).append(int(counts.size))
        info.setdefault("k_max", []).append(k_max)
        info.setdefault("k_p99", []).append(k_99)
        order = rng.permutation(X.shape[0])  # a fresh stream order per seed
        Xs, ys = X[order], y[order]
        configs: dict[str, dict[str, Any]] = {
            f"key_L{L}": dict(unit="key", epsilon=EPSILON, delta=DELTA, per_key=L) for L in per_keys}
        configs["record"] = dict(unit="record", epsilon=EPSILON, delta=DELTA, per_key=1)
        configs["record_group"] = dict(unit="record", epsilon=EPSILON / k_max, delta=DELTA / (k_max * math.e),
                                       per_key=1)
        configs["record_group_p99"] = dict(unit="record", epsilon=EPSILON / k_99, delta=DELTA / (k_99 * math.e),
                                           per_key=1)
        configs["non_private"] = dict(unit="record", epsilon=EPSILON, delta=DELTA, per_key=1, non_private=True)
        for label, cfg in configs.items():
            started = time.perf_counter()
            out = run(Xs, ys, Xt, yt, keys, memory=memory, q=q, seed=seed, **cfg)
            out["seconds"] = time.perf_counter() - started
            private_record = cfg["unit"] == "record" and not cfg.get("non_private")
            out["epsilon_per_record"] = cfg["epsilon"] if private_record else None
            rows.setdefault(label, []).append(out)
            print(f"{name} seed {seed} {label:>17}: log loss {out['log_loss']:.4f} auc {out['auc']:.4f} "
                  f"z {out['noise_multiplier']:.3g} steps {out['steps']}", flush=True)
    summary = {}
    for label, outs in rows.items():
        ll = np.array([o["log_loss"] for o in outs])
        auc = np.array([o["auc"] for o in outs])
        summary[label] = {"log_loss_mean": float(ll.mean()),
                          "log_loss_sd": float(ll.std(ddof=1)) if ll.size > 1 else 0.0,
                          "auc_mean": float(auc.mean()), "auc_sd": float(auc.std(ddof=1)) if auc.size > 1 else 0.0,
                          "runs": outs}
    best_key = min((k for k in summary if k.startswith("key_")), key=lambda k: summary[k]["log_loss_mean"])
    return {"n_stream": int(X.shape[0]), "n_test": int(Xt.shape[0]), "dim": int(X.shape[1]), "memory_records": memory,
            "q": q, "every_records": EVERY, "seeds": seeds, **info, "results": summary,
            "key_beats_group_route": bool(summary[best_key]["log_loss_mean"]
                                          < summary["record_group"]["log_loss_mean"]),
            "best_key_config": best_key}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one seed, smaller synthetic stream")
    args = ap.parse_args(argv)
    seeds = [0] if args.quick else [0, 1, 2]
    rng = np.random.default_rng(7)
    n = 30_000 if args.quick else 100_000
    X, y, Xt, yt = synthetic(n, 20_000, 10, rng)
    result: dict[str, Any] = {
        "description": "utility at epsilon 1 per person (unit key) vs record-level at epsilon 1 per record and "
                       "at the group-privacy epsilon giving (1, 1e-5) per person",
        "alpha": ALPHA, "max_events_per_person": MAX_EVENTS, "delta": DELTA, "machine": machine(),
        "synthetic_logistic": compare("synthetic", X, y, Xt, yt, seeds, memory=4000, q=0.1, per_keys=[1, 2]),
    }
    try:
        from datasets import load_adult

        split = load_adult()
        result["adult"] = compare("adult", split.X_train, split.y_train.astype(float), split.X_test,
                                  split.y_test.astype(float), seeds, memory=4000, q=0.1, per_keys=[1, 2])
    except Exception as exc:  # the data set comes from a wheel download; say so rather than fail
        result["adult"] = {"skipped": f"{type(exc).__name__}: {exc}"}
    if not args.quick:
        print(write_result("bench_key_privacy", result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
