"""Throughput of the private VIPS logistic-regression update against river, d = 100.

Both learners see the same records: unit-norm x in R^100 (a bias feature included) with labels
drawn from a logistic model. river's ``LogisticRegression.learn_one`` takes one SGD step per
record (its native input is a dict). Ours, per batch of 10,000 records drawn from a full
reservoir of 40,000:

* ``private_update``: the update itself, i.e. the E-step sums behind the wall (clipping,
  Pólya-Gamma means, S1, S2), the engine's noise draw (Gaussian + Analyze-Gauss) and the M-step
  (projection, Cholesky, q(alpha)) on batches drawn beforehand;
* ``engine_step``: a whole ``PrivateEngine.step``, adding batch sampling, the reservoir gather,
  the budget check, ledger append and privacy report (autodp RDP accountant, fixed-size
  sampling; the PLD accountant's per-step epsilon report costs far more and is the
  accountant's, not the update's).

Both for the float64 and the float32 E-step (``dtype``). Records/s = records in the batches /
wall time. Timings alternate between learners in rounds and take the median round, so machine
load hits all alike. Target: the float32 private update at >= 20x river's records/s (every
other figure is reported with its ratio).

Run: ``python benchmarks/bench_logistic_speed.py``; writes benchmarks/results/bench_logistic_speed.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from river import linear_model  # noqa: E402

from benchmarks.common import machine, write_result  # noqa: E402
from stream_vips.engine import PrivateEngine  # noqa: E402
from stream_vips.models.logistic import BayesianLogisticRegression  # noqa: E402
from stream_vips.privacy.accountant import RdpAccountant  # noqa: E402
from stream_vips.privacy.budget import BudgetMonitor  # noqa: E402
from stream_vips.privacy.ledger import MemoryLedger  # noqa: E402
from stream_vips.reservoir import Reservoir  # noqa: E402
from stream_vips.sampling import FixedSizeSampler  # noqa: E402

D = 100
RESERVOIR = 40_000
BATCH = 10_000
DTYPES = ("float64", "float32")
TARGET_DTYPE = "float32"
STEPS_PER_ROUND = 5
RIVER_RECORDS_PER_ROUND = 5_000
ROUNDS = 7
Z = 1.0
TARGET_RATIO = 20.0


def make_records(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, D)) / np.sqrt(D)
    X[:, -1] = 0.3
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    w = rng.normal(size=D) * 3
    y = (rng.random(n) < 1 / (1 + np.exp(-X @ w))).astype(float)
    return X, y


class CountingModel(BayesianLogisticRegression):
    """Counts the records whose statistics the engine asked for (the Poisson batch sizes)."""

    records = 0

    def clipped_sum(self, batch):
        self.records += len(batch["y"])
        return super().clipped_sum(batch)


def build_engine(X: np.ndarray, y: np.ndarray, dtype: str) -> PrivateEngine:
    model = CountingModel(D, RESERVOIR, dtype=dtype)
    reservoir = Reservoir(model.row_layout(), RESERVOIR, np.random.default_rng(1))
    reservoir.add_batch(model.parse_batch([{"x": x.tolist(), "y": int(t)} for x, t in zip(X, y)]).rows)
    monitor = BudgetMonitor(1e4, 1e-5, RdpAccountant(), MemoryLedger())
    engine = PrivateEngine(model, reservoir, FixedSizeSampler(BATCH), monitor, Z, np.random.default_rng(2),
                           tau0=100.0, kappa=0.7, accountant_name="autodp", seeded=True)
    model.set_noise_scale({k: s / engine.normaliser for k, s in engine.block_stds.items()})
    return engine


def time_engine(engine: PrivateEngine) -> tuple[float, float]:
    """(records/s of engine steps, records/s of the private update on pre-drawn batches)."""
    res, sampler, model = engine.reservoir, engine.sampler, engine.model
    batches = [res.take(sampler.sample(res.size, engine.rng, capacity=res.capacity)) for _ in range(STEPS_PER_ROUND)]
    t0 = time.perf_counter()
    for batch in batches:
        model.update(engine._noisy_mean(model.clipped_sum(batch)), 0.05)
    update_rate = sum(len(b["y"]) for b in batches) / (time.perf_counter() - t0)
    model.records = 0
    t0 = time.perf_counter()
    for _ in range(STEPS_PER_ROUND):
        if engine.step() is None:
            raise RuntimeError("budget exhausted during the benchmark")
    return model.records / (time.perf_counter() - t0), update_rate


def time_river(model: linear_model.LogisticRegression, dicts: list[dict], labels: list[bool], start: int) -> float:
    chunk = range(start, start + RIVER_RECORDS_PER_ROUND)
    t0 = time.perf_counter()
    for i in chunk:
        model.learn_one(dicts[i], labels[i])
    return RIVER_RECORDS_PER_ROUND / (time.perf_counter() - t0)


def main() -> dict:
    X, y = make_records(np.random.default_rng(0), RESERVOIR)
    engines = {dtype: build_engine(X, y, dtype) for dtype in DTYPES}
    dicts = [dict(enumerate(row.tolist())) for row in X]
    labels = [bool(t) for t in y]
    river_model = linear_model.LogisticRegression()
    time_river(river_model, dicts, labels, 0)  # warm-up
    rounds: dict[str, list[float]] = {"river_learn_one": []}
    for dtype, engine in engines.items():
        time_engine(engine)
        rounds[f"engine_step_{dtype}"], rounds[f"private_update_{dtype}"] = [], []
    for r in range(ROUNDS):
        start = (r * RIVER_RECORDS_PER_ROUND) % (RESERVOIR - RIVER_RECORDS_PER_ROUND)
        rounds["river_learn_one"].append(time_river(river_model, dicts, labels, start))
        for dtype, engine in engines.items():
            e, m = time_engine(engine)
            rounds[f"engine_step_{dtype}"].append(e)
            rounds[f"private_update_{dtype}"].append(m)
    rates = {name: float(np.median(values)) for name, values in rounds.items()}
    peer = rates["river_learn_one"]
    ratios = {name: rate / peer for name, rate in rates.items() if name != "river_learn_one"}
    ratio = ratios[f"private_update_{TARGET_DTYPE}"]
    result = {
        "benchmark": "bench_logistic_speed",
        "machine": machine(),
        "config": {"d": D, "reservoir": RESERVOIR, "batch": BATCH, "sampling": "fixed", "accountant": "autodp",
                   "noise_multiplier": Z, "steps_per_round": STEPS_PER_ROUND, "rounds": ROUNDS,
                   "river_records_per_round": RIVER_RECORDS_PER_ROUND},
        "records_per_s": rates,
        "ratio_vs_river": ratios,
        "rounds": rounds,
        "targets": {
            f"private_update_{TARGET_DTYPE}_vs_river": {
                "peer": "river.linear_model.LogisticRegression.learn_one",
                "ratio": ratio,
                "target": f">= {TARGET_RATIO}x",
                "met": bool(ratio >= TARGET_RATIO),
            }
        },
    }
    write_result("bench_logistic_speed", result)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
