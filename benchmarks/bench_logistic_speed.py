"""Throughput of the private VIPS logistic-regression engine step against river and scikit-learn.

Issue 20 asked for honest peers: the headline is the whole private step in the default float64,
``PrivateEngine.step()`` (drawing a fixed-size batch of 10,000 from a full reservoir of 40,000,
gathering it, ``clipped_sum`` behind the wall, the budget check and ledger append with the autodp
RDP accountant, the noise draw, normalisation and the M-step ``update``), on unit-norm x in R^100
(a bias feature included) with labels from a logistic model.

The peers learn from exactly the batches our float64 engine drew in the same round, as float64,
with the same batch size, on one thread (the script pins BLAS and OpenMP to one thread; river is
pure Python and scikit-learn's SGD is single-threaded Cython):

* ``river_learn_one``: river ``LogisticRegression.learn_one``, one SGD step per record, on dicts
  (river's native record type);
* ``river_learn_many``: river ``LogisticRegression.learn_many`` on a pandas DataFrame per batch,
  one averaged-gradient step per batch (as many model updates as our engine makes);
* ``sklearn_partial_fit``: scikit-learn ``SGDClassifier(loss="log_loss").partial_fit`` per batch
  (one SGD epoch over the batch).

Converting a batch to the peer's input type (dicts, DataFrame) is not timed, which favours the
peers. Each peer does O(d) work per record; our E-step does O(d^2) (the Pólya-Gamma parameter
c_n^2 = x^T E[m m^T] x and the second moment sum omega x x^T), so ``blas_bound`` also reports
the records/s of those two BLAS-3 products alone (triangular product + symmetric rank-n update,
n d^2 / 2 multiply-adds each), the ceiling for this algorithm on this machine and thread count.

Secondary figures: the float32 engine step and the bare private update (clipped_sum, noise,
M-step on pre-drawn batches) in both dtypes. Learners alternate within each round, ``ROUNDS``
rounds; records/s are given as min/median/max over rounds and ratios as the ratio of medians
(and the min/max of the per-round ratios). The machine is shared: the 1-minute load average at
each round start is recorded. Target: the float64 engine step at >= 20x river's fastest path
(also stated against ``learn_one``, the path the pre-issue-20 figures used). Earlier results are
kept in ``history``.

Run: ``python benchmarks/bench_logistic_speed.py [--label TEXT]``; writes
benchmarks/results/bench_logistic_speed.json. Needs river, scikit-learn and pandas.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

try:
    import pandas as pd
    import river
    import sklearn
    from river import linear_model
    from sklearn.linear_model import SGDClassifier
except ImportError as exc:  # pragma: no cover - the peers are what this benchmark measures
    raise SystemExit(f"bench_logistic_speed needs river, scikit-learn and pandas: {exc}") from exc

from benchmarks.common import RESULTS, machine, write_result
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import FixedSizeSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.logistic import BayesianLogisticRegression
from stream_vips.privacy.accountants import RdpAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.ledger import MemoryLedger

NAME = "bench_logistic_speed"
D = 100
RESERVOIR = 40_000
BATCH = 10_000
STEPS_PER_ROUND = 5
ROUNDS = 7
Z = 1.0
TARGET_RATIO = 20.0
HEADLINE = "engine_step_float64"
RIVER_PATHS = ("river_learn_one", "river_learn_many")
PEERS = {
    "river_learn_one": "river.linear_model.LogisticRegression().learn_one, one SGD step per record, "
                       "records as {int: float} dicts",
    "river_learn_many": "river.linear_model.LogisticRegression().learn_many, one mean-gradient step per "
                        "batch, each batch as a pandas DataFrame",
    "sklearn_partial_fit": "sklearn.linear_model.SGDClassifier(loss='log_loss').partial_fit, one SGD "
                           "epoch per batch, float64 numpy arrays",
}
FAIRNESS = ("Every peer learns from the very batches our float64 engine drew in the same round (10,000 "
            "records each, float64, the default dtype on both sides), single-threaded like our run; "
            "conversion to the peer's input type is not timed (in the peers' favour), while our figure "
            "includes batch sampling, the reservoir gather, the budget check and ledger append, noise "
            "and the M-step. The peers fit a point estimate with O(d) work per record; ours is private "
            "Bayesian VB with O(d^2) per record (see blas_bound).")


def make_records(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm inputs with a constant bias feature and labels drawn from a logistic model."""
    X = rng.normal(size=(n, D)) / np.sqrt(D)
    X[:, -1] = 0.3
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    w = rng.normal(size=D) * 3
    y = (rng.random(n) < 1 / (1 + np.exp(-X @ w))).astype(float)
    return X, y


class RecordingModel(BayesianLogisticRegression):
    """Counts the records the engine asked statistics for and keeps the batches (for the peers)."""

    records = 0
    batches: list[dict[str, np.ndarray]]

    def clipped_sum(self, batch):
        self.records += len(batch["y"])
        self.batches.append(batch)
        return super().clipped_sum(batch)


def build_engine(X: np.ndarray, y: np.ndarray, dtype: str) -> PrivateEngine:
    """A private engine over a full reservoir holding (X, y), autodp accountant, fixed-size batches."""
    model = RecordingModel(D, RESERVOIR, dtype=dtype)
    model.batches = []
    reservoir = Reservoir(model.row_layout(), RESERVOIR, np.random.default_rng(1))
    reservoir.add_batch(model.parse_batch([{"x": x.tolist(), "y": int(t)} for x, t in zip(X, y)]).rows)
    monitor = BudgetMonitor(1e4, 1e-5, RdpAccountant(), MemoryLedger())
    return PrivateEngine(model, reservoir, FixedSizeSampler(BATCH), monitor, Z, np.random.default_rng(2),
                         tau0=100.0, kappa=0.7, accountant_name="autodp", seeded=True)


def time_engine_steps(engine: PrivateEngine) -> tuple[float, list[dict[str, np.ndarray]]]:
    """Records/s of ``STEPS_PER_ROUND`` whole engine steps, and the batches they drew."""
    model = engine.model
    model.records, model.batches = 0, []
    t0 = time.perf_counter()
    for _ in range(STEPS_PER_ROUND):
        if engine.step() is None:
            raise RuntimeError("budget exhausted during the benchmark")
    rate = model.records / (time.perf_counter() - t0)
    batches, model.batches = model.batches, []
    return rate, batches


def time_private_update(engine: PrivateEngine, batches: list[dict[str, np.ndarray]]) -> float:
    """Records/s of the bare update (clipped_sum, the engine's noise and normalisation, M-step) on
    pre-drawn batches: no sampling, gather or budget check."""
    model = engine.model
    t0 = time.perf_counter()
    for batch in batches:
        model.update(engine._noisy_mean(BayesianLogisticRegression.clipped_sum(model, batch)), 0.05)
    return sum(len(b["y"]) for b in batches) / (time.perf_counter() - t0)


def time_blas_bound(engine: PrivateEngine, batches: list[dict[str, np.ndarray]]) -> float:
    """Records/s of the E-step's two BLAS-3 products alone on the same batches (float64): the
    triangular product for c_n^2 and the symmetric rank-n update for S2."""
    model = engine.model
    t0 = time.perf_counter()
    for batch in batches:
        X = batch["x"]
        model._trmm(1.0, model._sigma_factor, X.T, side=0, lower=1)
        X.T @ X  # numpy runs syrk for a product with its own transpose
    return sum(len(b["y"]) for b in batches) / (time.perf_counter() - t0)


def timed(fn: Callable[[], None], records: int) -> float:
    t0 = time.perf_counter()
    fn()
    return records / (time.perf_counter() - t0)


def peer_rates(batches: list[dict[str, np.ndarray]], peers: dict[str, Any]) -> dict[str, float]:
    """Records/s of each peer on ``batches`` (input conversion done before the clock starts)."""
    n = sum(len(b["y"]) for b in batches)
    ys = [b["y"].astype(bool) for b in batches]
    dicts = [[dict(enumerate(row)) for row in b["x"].tolist()] for b in batches]
    frames = [(pd.DataFrame(b["x"]), pd.Series(yb)) for b, yb in zip(batches, ys)]

    def learn_one() -> None:
        model = peers["river_learn_one"]
        for rows, yb in zip(dicts, ys):
            for x, t in zip(rows, yb.tolist()):
                model.learn_one(x, t)

    def learn_many() -> None:
        for frame, series in frames:
            peers["river_learn_many"].learn_many(frame, series)

    def partial_fit() -> None:
        for b in batches:
            peers["sklearn_partial_fit"].partial_fit(b["x"], b["y"])

    return {"river_learn_one": timed(learn_one, n), "river_learn_many": timed(learn_many, n),
            "sklearn_partial_fit": timed(partial_fit, n)}


def summary(values: list[float]) -> dict[str, float]:
    return {"min": float(np.min(values)), "median": float(np.median(values)), "max": float(np.max(values))}


def main(label: str | None = None) -> dict:
    X, y = make_records(np.random.default_rng(0), RESERVOIR)
    engines = {dtype: build_engine(X, y, dtype) for dtype in ("float64", "float32")}
    peers: dict[str, Any] = {
        "river_learn_one": linear_model.LogisticRegression(),
        "river_learn_many": linear_model.LogisticRegression(),
        "sklearn_partial_fit": SGDClassifier(loss="log_loss", random_state=0),
    }
    # warm-up: one round for everyone (first partial_fit declares the classes)
    _, warm = time_engine_steps(engines["float64"])
    time_engine_steps(engines["float32"])
    peers["sklearn_partial_fit"].partial_fit(warm[0]["x"], warm[0]["y"], classes=np.array([0.0, 1.0]))
    peer_rates(warm[:1], peers)

    rounds: dict[str, list[float]] = {}
    loads: list[float] = []
    for _ in range(ROUNDS):
        loads.append(os.getloadavg()[0])
        row: dict[str, float] = {}
        row[HEADLINE], batches = time_engine_steps(engines["float64"])
        row["engine_step_float32"], batches32 = time_engine_steps(engines["float32"])
        row.update(peer_rates(batches, peers))
        row["private_update_float64"] = time_private_update(engines["float64"], batches)
        row["private_update_float32"] = time_private_update(engines["float32"], batches32)
        row["blas_bound_float64"] = time_blas_bound(engines["float64"], batches)
        for name, value in row.items():
            rounds.setdefault(name, []).append(value)

    rates = {name: summary(values) for name, values in rounds.items()}
    medians = {name: s["median"] for name, s in rates.items()}
    river_fastest = max(RIVER_PATHS, key=medians.__getitem__)
    peer_names = list(PEERS)
    ratios = {
        f"{ours}_vs_{peer}": {
            "ratio_of_medians": medians[ours] / medians[peer],
            "per_round": summary([a / b for a, b in zip(rounds[ours], rounds[peer])]),
        }
        for ours in (HEADLINE, "engine_step_float32", "private_update_float64", "private_update_float32",
                     "blas_bound_float64")
        for peer in peer_names
    }

    def target(peer: str) -> dict[str, Any]:
        ratio = medians[HEADLINE] / medians[peer]
        return {"peer": PEERS[peer], "ratio": ratio, "target": f">= {TARGET_RATIO}x",
                "met": bool(ratio >= TARGET_RATIO)}

    result: dict[str, Any] = {
        "benchmark": NAME,
        "label": label or "run",
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "versions": {"numpy": np.__version__, "river": river.__version__, "scikit-learn": sklearn.__version__,
                     "pandas": pd.__version__},
        "load_avg_1min_at_round_start": summary(loads) | {"rounds": loads},
        "config": {"d": D, "reservoir": RESERVOIR, "batch": BATCH, "sampling": "fixed", "accountant": "autodp",
                   "noise_multiplier": Z, "dtype_headline": "float64", "steps_per_round": STEPS_PER_ROUND,
                   "rounds": ROUNDS},
        "peers": PEERS,
        "fairness": FAIRNESS,
        "records_per_s": rates,
        "ratios": ratios,
        "river_fastest_path": river_fastest,
        "targets": {
            f"{HEADLINE}_vs_river_fastest": target(river_fastest),
            f"{HEADLINE}_vs_river_learn_one": target("river_learn_one"),
        },
        "rounds": rounds,
    }
    previous_path = RESULTS / f"{NAME}.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else None
    history = previous.pop("history", []) if previous else []
    if previous:
        previous.setdefault("label", "before issue 20: river learn_one only; target was the float32 bare update")
        history.insert(0, previous)
    result["history"] = history
    write_result(NAME, result)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", help="what this run measures (kept with it in later histories)")
    out = main(parser.parse_args().label)
    print(json.dumps({k: out[k] for k in ("label", "records_per_s", "targets", "load_avg_1min_at_round_start")},
                     indent=2))
