"""``stream-vips demo``: the whole pipeline on a synthetic stream, with nothing but the package.

Synthetic records (1% malformed, to show the dead-letter path) flow through validation, the
reservoir and private updates with a small budget; model messages go to a JSONL file, metrics are
served over HTTP, updates halt when the budget is spent, and a summary scores the private model
against the known truth next to a non-private run (privacy.mode non_private, z = 0) on the same
records. ``--family`` picks the model: any family whose module describes a demo (its ``demo``:
the synthetic data it streams, the reservoir and schedule, and how the model is scored;
docs/families.md says what each one streams and scores); the others are refused, naming the
families that have one.

The demo writes into a fresh directory (``--out``, default a new temporary directory) and refuses
a directory that already holds a ledger: spent budget is never reset (privacy rule 7 in
docs/privacy.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from stream_vips.models.registry import MODEL_FAMILIES

if TYPE_CHECKING:
    from connectors.synthetic import SyntheticSource
    from stream_vips.config import Config
    from stream_vips.models.synthetic import Demo
    from stream_vips.service.app import Application

PLANNED_STEPS = 20
MALFORMED_FRACTION = 0.01


def demo_of(family: str) -> Demo:
    """The family's demo (its module's ``Model.demo``); a ValueError naming the families that
    have one when it has none."""
    from stream_vips.models.registry import model_class

    demo = model_class(family).demo
    if demo is None:
        having = [f for f in MODEL_FAMILIES if model_class(f).demo is not None]
        raise ValueError(f"the {family} family has no demo (the families with one: {', '.join(having)})")
    return demo


def demo_source(family: str, records: int, seed: int) -> SyntheticSource:
    """The family's demo stream: ``records`` records of its synthetic data, 1% malformed."""
    from connectors.synthetic import SyntheticSource

    return SyntheticSource(family, count=records, seed=seed, malformed_fraction=MALFORMED_FRACTION,
                           **demo_of(family).source)


def demo_config(out: Path, epsilon: float, metrics_port: int, seed: int, private: bool = True,
                family: str = "linreg", params: dict[str, Any] | None = None) -> Config:
    """The demo's configuration for ``family`` (model ``params`` from its synthetic source):
    Poisson sampling at q = batch_size / reservoir, calibrated for 20 planned steps."""
    fam = demo_of(family)
    if params is None:
        params = fam.params(demo_source(family, 0, seed).data, seed)
    data: dict[str, Any] = {
        "model": {"family": family, "id": "demo", "params": params},
        "privacy": {"epsilon": epsilon, "delta": 1e-5, "planned_steps": PLANNED_STEPS, "seed": seed,
                    "ledger": {"type": "file", "path": str(out / "ledger.jsonl")}},
        "sampling": {"method": "poisson", "reservoir": fam.reservoir, "batch_size": fam.batch_size},
        "schedule": {"every_records": fam.every_records, "tau0": 1.0, "kappa": fam.kappa},
        "sink": {"type": "jsonl", "path": str(out / "models.jsonl")},
        "dead_letter": {"type": "jsonl", "path": str(out / "dead-letters.jsonl")},
        "metrics": {"enabled": True, "host": "127.0.0.1", "port": metrics_port},
        "runtime": {"on_halt": "exit", "publish_interval_s": 0.0},  # a short run: a message per update
    }
    if not private:
        data["privacy"] = {"mode": "non_private", "seed": seed, "ledger": {"type": "memory"}}
        data["sink"] = {"type": "memory"}
        data["dead_letter"] = {"type": "memory"}
        data["metrics"] = {"enabled": False}
    from stream_vips.service.build import config_from_dict

    return config_from_dict(data, env={})


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


def run_demo(records: int | None = None, epsilon: float = 1.0, out: str | None = None, metrics_port: int = 0,
             seed: int = 0, progress: bool = True, family: str = "linreg",
             on_app: Callable[[Application], None] | None = None) -> dict[str, Any]:
    """Run the private demo of ``family`` and its non-private comparison; return the summary."""
    from connectors.memory import MemoryDeadLetterSink, MemorySink
    from stream_vips.service.app import Application

    fam = demo_of(family)
    records = fam.records if records is None else records
    out_dir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="stream-vips-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    if (out_dir / "ledger.jsonl").exists():
        raise SystemExit(f"{out_dir / 'ledger.jsonl'} exists: its budget is spent and is never reset; "
                         "choose a new --out directory")
    started = time.monotonic()
    logging.getLogger("stream_vips.service.app").setLevel(logging.ERROR)  # the summary reports the halt
    source = demo_source(family, records, seed)
    params = fam.params(source.data, seed)
    bar = ProgressBar(records) if progress else None
    app = Application.from_config(demo_config(out_dir, epsilon, metrics_port, seed, family=family, params=params),
                                  source=source, progress=bar)
    stats = app.run()
    if on_app is not None:
        on_app(app)
    if bar is not None:
        bar.finish(app)
    held_out = fam.held_out(source.data)  # fresh draws from the same generator, after the stream
    scores = fam.score(app.model, source.data, held_out)

    # Non-private comparison on exactly the records the private run consumed.
    base_source = demo_source(family, stats.records, seed)
    base = Application.from_config(demo_config(out_dir, epsilon, 0, seed, private=False, family=family,
                                               params=params),
                                   source=base_source, sink=MemorySink(), dead_letter=MemoryDeadLetterSink())
    base_stats = base.run()
    base_scores = fam.score(base.model, base_source.data, held_out)
    return {
        "family": family,
        "records": stats.records,
        "records_rejected": sum(stats.rejected.values()),
        "rejected_by_reason": dict(stats.rejected),
        "updates": stats.updates,
        "epsilon_spent": app.engine.epsilon_spent(),
        "epsilon_budget": app.engine.monitor.epsilon_budget,
        "delta": app.engine.monitor.delta,
        "noise_multiplier": app.engine.noise_multiplier,
        "halted": stats.halted,
        **scores,
        "non_private_updates": base_stats.updates,
        **{f"non_private_{k}": v for k, v in base_scores.items()},
        **fam.reference(source.data, held_out),
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
        *demo_of(s.get("family", "linreg")).lines(s),
        f"model messages       {s['messages_file']}",
        f"dead letters         {s['dead_letters_file']}",
        f"ledger               {s['ledger_file']}",
        f"metrics served on    port {s['metrics_port']} during the run (--serve-s keeps them up after)",
        f"wall time            {s['seconds']:.2f} s",
    ])


EXIT_CODES = """exit codes: 0 the demo ran; 2 a bad option or configuration (one line naming it, checked
before anything is spent, except a --json-summary file that cannot be written at the end, e.g. a
full disk: the summary is then on stdout only); 6 the privacy ledger in --out could not be written
(e.g. a full disk): no step was released without its ledger line"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from stream_vips.cli import plain  # the module docstring without its RST markup

    p = subparsers.add_parser("demo", help="run the pipeline on a synthetic stream (no Kafka needed)",
                              description=plain(__doc__), epilog=EXIT_CODES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=list(MODEL_FAMILIES), default="linreg",
                   help="model family with a demo (default linreg); see above")
    p.add_argument("--records", type=int, help="synthetic records to stream (default: the family's demo's; the "
                   "run halts earlier once the budget is spent)")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (default 1.0, delta 1e-5)")
    p.add_argument("--json-summary", metavar="FILE", help="also write the summary as JSON to FILE")
    p.add_argument("--out", metavar="DIR", help="output directory (default: a new temporary directory)")
    p.add_argument("--metrics-port", type=int, default=0, help="metrics port (default 0: any free port)")
    p.add_argument("--seed", type=int, default=0, help="seed of data and noise (demo only; reported as seeded)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--serve-s", type=float, default=0.0, metavar="SECONDS",
                   help="keep serving the run's metrics this long after it ends (default 0)")
    return p


def option_problem(args: argparse.Namespace) -> str | None:
    """Why the demo's options cannot run, or ``None``; checked before anything is spent. A
    missing ``--out`` directory is created here (the run would create it)."""
    from stream_vips.cli.output import output_file_problem

    try:
        fam = demo_of(args.family)
    except ValueError as exc:
        return f"--family {args.family}: {exc}"
    if args.records is not None and args.records < fam.reservoir + fam.every_records:
        return (f"--records must be at least {fam.reservoir + fam.every_records} to fill the reservoir and update "
                f"({args.family})")
    if not args.epsilon > 0:
        return "--epsilon must be > 0"
    if args.seed < 0:
        return f"--seed must be a non-negative integer, got {args.seed}"
    if not 0 <= args.metrics_port <= 65535:
        return f"--metrics-port must be in [0, 65535] (0: any free port), got {args.metrics_port}"
    if args.json_summary and (problem := output_file_problem(args.json_summary, "--json-summary")):
        return problem
    if args.out is not None:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            return f"--out {args.out}: exists and is not a directory"
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"--out {args.out}: cannot create it: {exc.strerror or exc}"
        if not os.access(out, os.W_OK):
            return f"--out {args.out}: not writable"
    return None


def run(args: argparse.Namespace) -> int:
    """See :data:`EXIT_CODES`."""
    from stream_vips.cli.output import write_summary
    from stream_vips.config import ConfigError
    from stream_vips.privacy.ledger import LedgerWriteError

    def say(line: str) -> None:
        print(f"stream-vips demo: {line}", file=sys.stderr)

    if problem := option_problem(args):
        say(problem)
        return 2
    apps: list[Application] = []
    try:
        summary = run_demo(args.records, args.epsilon, args.out, args.metrics_port, args.seed,
                           progress=not args.no_progress, family=args.family, on_app=apps.append)
    except ConfigError as exc:  # e.g. the metrics port is busy: refused before consuming
        say(f"configuration error: {exc}")
        return 2
    except LedgerWriteError as exc:
        say(f"stopped: {exc}")
        return 6
    print(format_summary(summary))
    if args.json_summary and (problem := write_summary(args.json_summary, json.dumps(summary, indent=2))):
        say(problem)
        return 2
    if args.serve_s > 0:
        serve_metrics(apps[0], summary["metrics_port"], args.serve_s)
    return 0


def serve_metrics(app: Application, port: int, seconds: float) -> None:
    """Keep serving the finished run's metrics on the same port (to point a Prometheus at them)."""
    from stream_vips.service.metrics import MetricsServer

    server = MetricsServer(app.metrics, "127.0.0.1", port)
    print(f"serving the run's metrics on http://127.0.0.1:{server.port}/metrics for {seconds:g} s "
          "(Ctrl-C stops)", file=sys.stderr, flush=True)
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
