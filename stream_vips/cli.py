"""The ``stream-vips`` command: ``run``, ``demo``, ``plan`` and ``inspect`` subcommands.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` and ``run(args) -> int``;
they are imported lazily so that one missing optional piece never breaks the others.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

from stream_vips import __version__

#: subcommand -> module with add_parser(subparsers) and run(args) -> int
SUBCOMMANDS = {
    "run": "stream_vips.cli",
    "demo": "stream_vips.demo",
    "plan": "stream_vips.plan",
    "inspect": "stream_vips.inspect",
    "reset": "stream_vips.reset",
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``run`` subcommand."""
    p = subparsers.add_parser("run", help="run the pipeline from a YAML configuration",
                              description="Run the pipeline until the source is exhausted or a signal "
                                          "arrives. Environment overrides: STREAM_VIPS__SECTION__KEY=value.",
                              epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="YAML configuration (default: built-in defaults)")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="overrides runtime.log_level")
    return p


EXIT_CODES = """exit codes: 0 a clean end (exhausted, halted or signalled); 1 a model could not be
published; 2 bad configuration; 3 the privacy state refuses the start (a ledger that is
corrupt, locked by another process, or does not hold the steps that the checkpoint or the
published model reflect: restore it, or start a new budget with `stream-vips reset`); 4 a dead
letter was not delivered (nothing was committed past it)"""


def run(args: argparse.Namespace) -> int:
    """``stream-vips run``: see :data:`EXIT_CODES`."""
    from stream_vips.config import ConfigError, load_config
    from stream_vips.logsafety import guard_client_logging
    from stream_vips.pipeline import Application, DeadLetterError, PublishError
    from stream_vips.privacy.ledger import LedgerCorrupt, LedgerLocked, LedgerMismatch

    try:
        config = load_config(args.config)
        logging.basicConfig(level=args.log_level or config.runtime.log_level, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        guard_client_logging()  # the Kafka client logs raw record bytes at DEBUG otherwise
        app = Application.from_config(config)
    except ConfigError as exc:
        print(f"stream-vips: configuration error: {exc}", file=sys.stderr)
        return 2
    except (LedgerCorrupt, LedgerLocked, LedgerMismatch) as exc:
        print(f"stream-vips: refusing to start: {exc}", file=sys.stderr)
        return 3
    try:
        stats = app.run()
    except PublishError as exc:
        print(f"stream-vips: {exc}; stopped (the ledger still holds every released step)", file=sys.stderr)
        return 1
    except DeadLetterError as exc:
        print(f"stream-vips: {exc}", file=sys.stderr)
        return 4
    rejected = sum(stats.rejected.values())
    print(f"stream-vips: stopped: {stats.records} records ({rejected} rejected), {stats.updates} updates, "
          f"epsilon {app.engine.epsilon_spent():.6g}, halted {stats.halted}"
          f"{' (signal)' if stats.stopped_by_signal else ''}", file=sys.stderr)
    return 0


def _unavailable(name: str, subparsers: argparse._SubParsersAction, exc: Exception) -> None:
    p = subparsers.add_parser(name, help=f"(unavailable: {exc})", add_help=False)
    p.set_defaults(_run=lambda args: _fail(name, exc), _unavailable=True)


def _fail(name: str, exc: Exception) -> int:
    print(f"stream-vips {name}: not available in this installation: {exc}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stream-vips", description="Differentially private Bayesian "
                                     "inference on event streams.")
    parser.add_argument("--version", action="version", version=f"stream-vips {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = sys.modules[__name__] if module_name == __name__ else importlib.import_module(module_name)
        except ImportError as exc:
            _unavailable(name, subparsers, exc)
            continue
        sub = module.add_parser(subparsers)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "_unavailable", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
