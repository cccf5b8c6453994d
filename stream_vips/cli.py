"""The ``stream-vips`` command and its subcommands (``run`` lives here; the others in their modules).

:data:`SUBCOMMANDS` is the one registry: each subcommand's module (exposing
``add_parser(subparsers)`` and ``run(args) -> int``) and its one-line help. The top-level help is
built from that table alone, and only the chosen subcommand's module is imported, so
``stream-vips --help`` never loads numpy, the models or the Kafka client, and one missing optional
piece never breaks the other subcommands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from stream_vips import __version__

#: subcommand -> (module with add_parser(subparsers) and run(args) -> int, one-line help).
#: The only place a subcommand is registered; the help line is shown by ``stream-vips --help``
#: without importing the module.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("stream_vips.cli", "run the pipeline from a YAML configuration"),
    "demo": ("stream_vips.demo", "run the pipeline on a synthetic stream (no Kafka needed)"),
    "plan": ("stream_vips.plan", "epsilon for a noise multiplier, or the noise multiplier for a target epsilon"),
    "inspect": ("stream_vips.inspect",
                "print the latest model per id on a model topic or in a JSONL model file"),
    "reset": ("stream_vips.reset", "start a new privacy budget deliberately (the old ledger is kept and named)"),
    "fit": ("stream_vips.fitting", "fit a model to a finite JSONL data set, spending the whole privacy budget"),
    "report": ("stream_vips.report", "write a privacy and model report (PNG and HTML) from a ledger and the published models"),
    "config": ("stream_vips.config_cmd", "print the effective configuration after environment overrides (secrets redacted)"),
    "topics": ("stream_vips.topics_cmd", "create or check every Kafka topic a configuration names"),
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``run`` subcommand."""
    p = subparsers.add_parser("run", help="run the pipeline from a YAML configuration",
                              description="Run the pipeline until the source is exhausted or a signal "
                                          "arrives. Environment overrides: STREAM_VIPS__SECTION__KEY=value.",
                              epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="YAML configuration (default: built-in defaults)")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="overrides runtime.log_level")
    p.add_argument("--json-summary", metavar="FILE", help="also write the final summary as JSON to FILE (- for stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress line while running")
    return p


EXIT_CODES = """exit codes: 0 a clean end (exhausted, halted for the budget, or signalled); 1 a model could not be
published (the run retried it with its input paused and no new step until it was stopped); 2 bad configuration or option (the message names the key or flag, e.g. metrics.port when
the port is busy; checked before anything is spent, except a --json-summary file that cannot be
written at the end, e.g. a full disk: the summary is then on stderr only); 3 the privacy state
refuses the start (a ledger that is corrupt, locked by another process, or does not hold the steps
that the checkpoint or the published model reflect: restore it, or start a new budget with
`stream-vips reset`); 4 a dead letter was not delivered (nothing was committed past it); 5 a connector
failed past its retry deadline (e.g. the Kafka broker unreachable); 6 the privacy ledger could not
be written (e.g. a full disk at privacy.ledger.path): no step was released without its ledger line;
free space and restart; 7 the Kafka broker refused access: authentication failed, or an operation
is not authorized (the message names the principal, operation and resource to grant); 8 updates
halted because the reservoir holds mostly rejected arrivals (sampling.max_rejected_fraction: the
input is wrong; the summary names the top rejection reasons). A run that ends because the privacy
budget is spent ends with 0: that is how such a run is meant to end"""


def run(args: argparse.Namespace) -> int:
    """``stream-vips run``: see :data:`EXIT_CODES`."""
    import json
    import time

    from stream_vips import console
    from stream_vips.config import ConfigError, load_config
    from stream_vips.errors import StreamVipsError
    from stream_vips.logsafety import guard_client_logging
    from stream_vips.pipeline import Application, DeadLetterError, PublishError
    from stream_vips.privacy.ledger import LedgerCorrupt, LedgerLocked, LedgerMismatch, LedgerWriteError

    def say(line: str) -> None:
        print(f"stream-vips: {line}", file=sys.stderr)

    started = time.monotonic()
    config = None
    if args.json_summary and (problem := output_file_problem(args.json_summary, "--json-summary")):
        say(problem)
        return 2
    try:
        config = load_config(args.config)
        logging.basicConfig(level=args.log_level or config.runtime.log_level, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        guard_client_logging()  # the Kafka client logs raw record bytes at DEBUG otherwise
        app = Application.from_config(config)
    except ConfigError as exc:
        say(f"configuration error: {exc}")
        return 2
    except (LedgerCorrupt, LedgerLocked, LedgerMismatch) as exc:
        say(f"refusing to start: {exc}")
        return 3
    except LedgerWriteError as exc:
        say(f"cannot start: {exc}")
        return 6
    except Exception as exc:
        if (denied := _refusal(exc, config)) is not None:
            say(f"cannot start: {denied}")
            return 7
        if _connector_failure(exc):
            say(f"cannot start: {type(exc).__name__}: {exc}")
            return 5
        raise
    for warning in console.startup_warnings(app, config):
        say(f"warning: {warning}")
    progress = None if args.no_progress else console.Progress()
    app.progress = progress

    def on_start(app: Application) -> None:
        print("\n".join(console.startup_lines(app, config)), file=sys.stderr)

    try:
        stats = app.run(on_start=on_start)
    except ConfigError as exc:
        say(f"configuration error: {exc}")
        return 2
    except PublishError as exc:
        say(f"{exc}; stopped (the ledger still holds every released step)")
        return 1
    except DeadLetterError as exc:
        say(str(exc))
        return 4
    except LedgerWriteError as exc:
        say(f"stopped: {exc}")
        return 6
    except (StreamVipsError, Exception) as exc:
        if (denied := _refusal(exc, config)) is not None:
            say(f"stopped: {denied}")
            return 7
        if _connector_failure(exc):
            say(f"stopped: {type(exc).__name__}: {exc} (nothing was committed past the records applied)")
            return 5
        raise
    finally:
        if progress is not None:
            progress.finish(app)
    summary = console.summary(app, stats, time.monotonic() - started)
    print(console.format_summary(summary), file=sys.stderr)
    if args.json_summary:
        text = json.dumps(summary, indent=2)
        if args.json_summary == "-":
            print(text)
        elif problem := write_summary(args.json_summary, text):
            say(problem)
            return 2
    if stats.halt_cause == "rejected_data":
        say(f"halted on rejected data: {stats.halt_reason}")
        return 8
    return 0


def write_summary(path: str, text: str) -> str | None:
    """Write the JSON summary ``text`` to ``path`` (``--json-summary``); why it failed, or ``None``.
    The summary was already printed, so a failure (a full disk) loses nothing."""
    try:
        Path(path).write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        return f"--json-summary {path}: cannot write it: {exc.strerror or exc} (the summary is above)"
    return None


def output_file_problem(path: str, flag: str) -> str | None:
    """Why the file ``path`` given to ``flag`` cannot be written at the end of a run (it is not
    a file, or its directory is missing or not writable), or ``None``: checked before the run
    starts, so a mistyped path costs no privacy budget. ``-`` (stdout) is always fine.

    >>> output_file_problem("/", "--json-summary")
    '--json-summary /: is a directory; name a file'
    >>> output_file_problem("/no/such/dir/s.json", "--json-summary")
    '--json-summary /no/such/dir/s.json: directory /no/such/dir does not exist'
    """
    if path == "-":
        return None
    target = Path(path)
    parent = target.parent
    if target.is_dir():
        return f"{flag} {path}: is a directory; name a file"
    if not parent.is_dir():
        return f"{flag} {path}: directory {parent} does not exist"
    if not os.access(target if target.exists() else parent, os.W_OK):
        return f"{flag} {path}: not writable"
    return None


def _refusal(exc: BaseException, config: Any) -> Any:
    """The broker's refusal behind ``exc`` (a :class:`~connectors.kafka.KafkaAccessDenied`), or
    ``None``. Connectors raise it themselves; a refusal that reaches here as the client library's
    own error (the source's consumer, mid-run) is named with the source's principal."""
    try:
        from connectors.kafka import security_options
        from connectors.kafka.access import denial
    except ImportError:  # no Kafka client installed: no Kafka refusal either
        return None
    kafka_source = config is not None and config.source.type == "kafka"
    try:
        security = security_options(config.source.options) if kafka_source else {}
    except Exception:  # the source's settings are not where this failed
        security = {}
    return denial(exc, security)


def _connector_failure(exc: BaseException) -> bool:
    """A Kafka connector or client error (the broker unreachable past a retry deadline)."""
    return any(cls.__module__.split(".")[0] == "kafka" or cls.__name__ == "KafkaConnectorError"
               for cls in type(exc).__mro__)


def plain(doc: str) -> str:
    """``doc`` as plain help text: RST literals and roles (double backticks, ``:class:`x```)
    become their bare text, so ``--help`` can reuse a module docstring."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc).replace("``", "")


def _entry(name: str) -> tuple[str, str]:
    """(module, help line) of a registered subcommand (a bare module name has no help line)."""
    entry = SUBCOMMANDS[name]
    return (entry, "") if isinstance(entry, str) else (entry[0], entry[1])


def _unavailable(name: str, subparsers: argparse._SubParsersAction, exc: Exception) -> None:
    p = subparsers.add_parser(name, help=f"(unavailable: {exc})", add_help=False)
    p.set_defaults(_run=lambda args: _fail(name, exc), _unavailable=True)


def _fail(name: str, exc: Exception) -> int:
    print(f"stream-vips {name}: not available in this installation: {exc}", file=sys.stderr)
    return 2


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``stream-vips`` parser. Every subcommand is listed from :data:`SUBCOMMANDS` as a
    placeholder that accepts anything; only ``command`` is built from its (imported) module."""
    parser = argparse.ArgumentParser(prog="stream-vips", description="Differentially private Bayesian "
                                     "inference on event streams.")
    parser.add_argument("--version", action="version", version=f"stream-vips {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module_name, help_line = _entry(name)
        if name != command:
            subparsers.add_parser(name, help=help_line, add_help=False).set_defaults(_placeholder=True)
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            _unavailable(name, subparsers, exc)
            continue
        sub = module.add_parser(subparsers)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Two-stage parse: the placeholders find the subcommand (or print the top-level help), then
    the parser is rebuilt with that subcommand's real parser and the arguments parsed again."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "_placeholder", False):
        parser = build_parser(args.command)
        args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "_unavailable", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args._run(args))


if __name__ == "__main__":
    sys.exit(main())
