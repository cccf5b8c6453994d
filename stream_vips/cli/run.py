"""``stream-vips run``: the service from one YAML configuration, with its exit codes."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable
from typing import Any

from stream_vips.cli.output import output_file_problem, write_summary


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
published (the run retried it with its input paused and no new step until it was stopped); \
2 bad configuration or option (the message names the key or flag, e.g. metrics.port when
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
    import time

    from stream_vips.cli import console
    from stream_vips.config import ConfigError
    from stream_vips.errors import StreamVipsError
    from stream_vips.logsafety import guard_client_logging
    from stream_vips.privacy.ledger import LedgerCorrupt, LedgerLocked, LedgerMismatch, LedgerWriteError
    from stream_vips.service.app import Application, DeadLetterError, PublishError
    from stream_vips.service.build import load_config

    def say(line: str) -> None:
        print(f"stream-vips: {line}", file=sys.stderr)

    started = time.monotonic()
    config = None
    service = None
    if args.json_summary and (problem := output_file_problem(args.json_summary, "--json-summary")):
        say(problem)
        return 2
    try:
        config = load_config(args.config)
        logging.basicConfig(level=args.log_level or config.runtime.log_level, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        guard_client_logging()  # the Kafka client logs raw record bytes at DEBUG otherwise
        if config.runtime.shards > 1 or config.runtime.engine == "ray":
            from stream_vips.cli import sharded

            service = sharded.start(config)
        else:
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
        if connector_failure(exc):
            say(f"cannot start: {type(exc).__name__}: {exc}")
            return 5
        raise
    if service is not None:
        return run_sharded(service, args, config, say, started)
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
        if (code := _stopped(exc, config, say)) is not None:
            return code
        raise
    finally:
        if progress is not None:
            progress.finish(app)
    summary = console.summary(app, stats, time.monotonic() - started)
    print(console.format_summary(summary), file=sys.stderr)
    return _finish(summary, args, say)


def run_sharded(service: Any, args: argparse.Namespace, config: Any, say: Any, started: float) -> int:
    """``runtime.shards`` > 1 or ``runtime.engine: ray``: the shards read their partitions, the
    driver releases and publishes (privacy rule 14, :mod:`stream_vips.cli.sharded`); the exit codes
    of :func:`run` where they apply (1, 2, 4, 5, 6, 7, 8; 3 at start)."""
    import time

    from stream_vips.cli import console, sharded
    from stream_vips.config import ConfigError
    from stream_vips.distributed import DeadLetterUndelivered, PublishFailed, ShardFailure, SourceFailed
    from stream_vips.privacy.ledger import LedgerWriteError

    progress = None if args.no_progress else sharded.ShardProgress()
    try:
        try:
            say(sharded.startup_line(service))
            sharded.serve(service, progress)
        finally:
            if progress is not None:
                progress.finish(service)
    except ConfigError as exc:
        say(f"configuration error: {exc}")
        return 2
    except PublishFailed as exc:
        say(str(exc))
        return 1
    except DeadLetterUndelivered as exc:
        say(str(exc))
        return 4
    except LedgerWriteError as exc:
        say(f"stopped: {exc}")
        return 6
    except ShardFailure as exc:
        say(f"stopped: {exc} (nothing was spent on the abandoned step)")
        return 5
    except SourceFailed as exc:  # a shard's connector, past its own retry deadline: as one process
        error = exc.error if exc.error is not None else exc.__cause__
        if (denied := _refusal(error, config)) is not None:
            say(f"stopped: {denied}")
            return 7
        if connector_failure(error) if error is not None else _connector_kinds(exc.error_kinds):
            say(f"stopped: {exc.summary} (nothing was committed past the records applied)")
            return 5
        raise
    except Exception as exc:
        if (code := _stopped(exc, config, say)) is not None:
            return code
        raise
    finally:
        service.close()
    summary = sharded.summary(service, time.monotonic() - started)
    print(console.format_summary(summary) + "\n" + sharded.format_shards(summary), file=sys.stderr)
    return _finish(summary, args, say)


def _finish(summary: dict[str, Any], args: argparse.Namespace, say: Any) -> int:
    """Write the JSON summary where asked (2: it cannot be written) and give the run's exit code
    (8: halted on rejected data, else 0)."""
    if args.json_summary:
        text = json.dumps(summary, indent=2)
        if args.json_summary == "-":
            print(text)
        elif problem := write_summary(args.json_summary, text):
            say(problem)
            return 2
    if summary["halt_cause"] == "rejected_data":
        say(f"halted on rejected data: {summary['halt_reason']}")
        return 8
    return 0


def _stopped(exc: BaseException, config: Any, say: Any) -> int | None:
    """A run stopped by ``exc``: 7 for the broker's refusal, 5 for a connector's failure, each
    said in one line; ``None`` for anything else (a bug: the caller re-raises it)."""
    if (denied := _refusal(exc, config)) is not None:
        say(f"stopped: {denied}")
        return 7
    if connector_failure(exc):
        say(f"stopped: {type(exc).__name__}: {exc} (nothing was committed past the records applied)")
        return 5
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


def connector_failure(exc: BaseException) -> bool:
    """A Kafka connector or client error (the broker unreachable past a retry deadline)."""
    return _connector_kinds(f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__)


def _connector_kinds(kinds: Iterable[str]) -> bool:
    """Whether an error of the classes named ``kinds`` (``module.Class``) is a Kafka connector's or
    client's (a shard's error that came back from a Ray actor is known by these names only)."""
    return any(kind.split(".")[0] == "kafka" or kind.rpartition(".")[2] == "KafkaConnectorError" for kind in kinds)
