"""``stream-vips demo``: the whole pipeline on a synthetic stream, with nothing but the package.

Synthetic linear-regression records (1% malformed, to show the dead-letter path) flow through
validation, the reservoir and private updates with a small budget; model messages go to a JSONL
file, metrics are served over HTTP, updates halt when the budget is spent, and a summary compares
the private model's error against the true weights with a non-private run on the same records.

The demo writes into a fresh directory (``--out``, default a new temporary directory) and refuses
a directory that already holds a ledger: spent budget is never reset (DESIGN rule 7).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from connectors.memory import MemoryDeadLetterSink, MemorySink
from connectors.synthetic import SyntheticRegressionSource
from stream_vips.config import Config, config_from_dict
from stream_vips.pipeline import Application

DIMENSION = 5
NOISE_STD = 0.2
X_SCALE = 0.8
RESERVOIR = 10_000
BATCH_SIZE = 2_000
EVERY_RECORDS = 1_000
PLANNED_STEPS = 20


def demo_config(out: Path, epsilon: float, metrics_port: int, seed: int, private: bool = True) -> Config:
    """The demo's configuration: linreg on d=5 synthetic records, Poisson q=0.2 over M=10000."""
    data: dict[str, Any] = {
        "model": {"family": "linreg", "id": "demo", "params": {
            "dim": DIMENSION, "noise_precision": 1.0 / NOISE_STD**2, "x_bound": 1.0, "y_bound": 2.0}},
        "privacy": {"epsilon": epsilon, "delta": 1e-5, "planned_steps": PLANNED_STEPS, "seed": seed,
                    "ledger": {"type": "file", "path": str(out / "ledger.jsonl")}},
        "sampling": {"method": "poisson", "reservoir": RESERVOIR, "batch_size": BATCH_SIZE},
        "schedule": {"every_records": EVERY_RECORDS, "tau0": 1.0, "kappa": 0.7},
        "sink": {"type": "jsonl", "path": str(out / "models.jsonl")},
        "dead_letter": {"type": "jsonl", "path": str(out / "dead-letters.jsonl")},
        "metrics": {"enabled": True, "host": "127.0.0.1", "port": metrics_port},
        "runtime": {"on_halt": "exit"},
    }
    if not private:
        data["privacy"] = {"mode": "non_private", "seed": seed, "ledger": {"type": "memory"}}
        data["sink"] = {"type": "memory"}
        data["dead_letter"] = {"type": "memory"}
        data["metrics"] = {"enabled": False}
    return config_from_dict(data, env={})


def _source(records: int, seed: int) -> SyntheticRegressionSource:
    return SyntheticRegressionSource(count=records, dimension=DIMENSION, noise_std=NOISE_STD, x_scale=X_SCALE,
                                     seed=seed, malformed_fraction=0.01)


class ProgressBar:
    """A one-line progress bar on ``stream`` (redrawn at most every 0.1 s)."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.total, self.width = total, width
        self.stream = stream if stream is not None else sys.stderr
        self._last = 0.0

    def __call__(self, app: Application) -> None:
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        self.draw(app)

    def draw(self, app: Application) -> None:
        done = app.stats.records
        filled = int(self.width * min(1.0, done / max(self.total, 1)))
        bar = "#" * filled + "." * (self.width - filled)
        eps = app.engine.epsilon_spent()
        budget = app.engine.monitor.epsilon_budget if app.engine.monitor is not None else float("inf")
        self.stream.write(f"\r[{bar}] {done}/{self.total} records  {app.stats.updates} updates  "
                          f"epsilon {eps:.3f}/{budget:g}{'  HALTED' if app.halted else ''}")
        self.stream.flush()

    def finish(self, app: Application) -> None:
        self.draw(app)
        self.stream.write("\n")
        self.stream.flush()


def run_demo(records: int = 40_000, epsilon: float = 1.0, out: str | None = None, metrics_port: int = 0,
             seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """Run the private demo and its non-private comparison; return the summary."""
    out_dir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="stream-vips-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / "ledger.jsonl").exists():
        raise SystemExit(f"{out_dir / 'ledger.jsonl'} exists: its budget is spent and is never reset; "
                         "choose a new --out directory")
    started = time.monotonic()
    logging.getLogger("stream_vips.pipeline").setLevel(logging.ERROR)  # the summary reports the halt
    source = _source(records, seed)
    bar = ProgressBar(records) if progress else None
    app = Application.from_config(demo_config(out_dir, epsilon, metrics_port, seed), source=source, progress=bar)
    stats = app.run()
    if bar is not None:
        bar.finish(app)
    error = float(np.linalg.norm(app.model.posterior_mean() - source.weights))

    # Non-private comparison on exactly the records the private run consumed.
    base_source = _source(stats.records, seed)
    base = Application.from_config(demo_config(out_dir, epsilon, 0, seed, private=False), source=base_source,
                                   sink=MemorySink(), dead_letter=MemoryDeadLetterSink())
    base_stats = base.run()
    base_error = float(np.linalg.norm(base.model.posterior_mean() - base_source.weights))
    return {
        "records": stats.records,
        "records_rejected": sum(stats.rejected.values()),
        "rejected_by_reason": dict(stats.rejected),
        "updates": stats.updates,
        "epsilon_spent": app.engine.epsilon_spent(),
        "epsilon_budget": app.engine.monitor.epsilon_budget,
        "delta": app.engine.monitor.delta,
        "noise_multiplier": app.engine.noise_multiplier,
        "halted": stats.halted,
        "model_error": error,
        "non_private_updates": base_stats.updates,
        "non_private_model_error": base_error,
        "true_weights": source.weights.tolist(),
        "messages_file": str(out_dir / "models.jsonl"),
        "dead_letters_file": str(out_dir / "dead-letters.jsonl"),
        "ledger_file": str(out_dir / "ledger.jsonl"),
        "metrics_port": app.metrics_port,
        "seconds": round(time.monotonic() - started, 3),
    }


def format_summary(s: dict[str, Any]) -> str:
    """Human-readable summary lines."""
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s["rejected_by_reason"].items())) or "none"
    return "\n".join([
        f"records consumed     {s['records']} ({s['records_rejected']} rejected: {reasons})",
        f"private updates      {s['updates']} (noise multiplier z = {s['noise_multiplier']:.3f})",
        f"epsilon spent        {s['epsilon_spent']:.4f} of budget {s['epsilon_budget']:g} (delta {s['delta']:g})",
        f"halted               {'yes, budget spent' if s['halted'] else 'no'}",
        f"model error          |E[w] - w_true| = {s['model_error']:.4f} (private)",
        f"                     |E[w] - w_true| = {s['non_private_model_error']:.4f} "
        f"(non-private, same records, {s['non_private_updates']} updates)",
        f"model messages       {s['messages_file']}",
        f"dead letters         {s['dead_letters_file']}",
        f"ledger               {s['ledger_file']}",
        f"metrics served on    port {s['metrics_port']} during the run",
        f"wall time            {s['seconds']:.2f} s",
    ])


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="run the pipeline on a synthetic stream (no Kafka needed)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=40_000, help="synthetic records to stream (default 40000)")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (default 1.0, delta 1e-5)")
    p.add_argument("--json-summary", metavar="FILE", help="also write the summary as JSON to FILE")
    p.add_argument("--out", metavar="DIR", help="output directory (default: a new temporary directory)")
    p.add_argument("--metrics-port", type=int, default=0, help="metrics port (default 0: any free port)")
    p.add_argument("--seed", type=int, default=0, help="seed of data and noise (demo only; reported as seeded)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args: argparse.Namespace) -> int:
    if args.records < RESERVOIR + EVERY_RECORDS:
        print(f"--records must be at least {RESERVOIR + EVERY_RECORDS} to fill the reservoir and update",
              file=sys.stderr)
        return 2
    if not args.epsilon > 0:
        print("--epsilon must be > 0", file=sys.stderr)
        return 2
    summary = run_demo(args.records, args.epsilon, args.out, args.metrics_port, args.seed,
                       progress=not args.no_progress)
    print(format_summary(summary))
    if args.json_summary:
        Path(args.json_summary).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0
