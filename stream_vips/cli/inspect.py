"""``stream-vips inspect``: the latest published model per id with its privacy report.

Reads either a model topic or a JSONL model file (what ``stream-vips demo`` and ``run`` write
with a ``jsonl`` sink) and prints, per model id, the version, family, parameter shapes and
privacy report; ``--json`` prints the same as one JSON object (natural parameters as shapes
only: the arrays stay where they were published).

A topic is read with :class:`~stream_vips.client.ModelReader` (read_committed, chunked messages
reassembled, schema checked) up to its current end. The broker must answer within
``--timeout-s`` seconds (default 10); an unreachable broker is one line on stderr and exit code
5, a refused login or a user without Read on the topic ("not authorized") exit code 7, as for
``stream-vips run``. Security settings come from ``STREAM_VIPS_KAFKA_*`` environment
variables (the password also from a file: ``STREAM_VIPS_KAFKA_SASL_PASSWORD_FILE``), as for the
connectors.

A file is read from its end backwards: the latest model of an id is its last line that passes
the schema (the line the pipeline itself resumes from), so a file that has grown for months
costs one parse per model id, not one per line. Lines that fail the schema are skipped and
counted; a torn last line (a write cut by a crash) is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from stream_vips.errors import StreamVipsError

PRIVACY_FIELDS = ("epsilon_spent", "epsilon_budget", "delta", "accountant", "sampling", "q",
                  "noise_multiplier", "paper_sigma", "adjacency", "steps", "halted", "seeded")

#: Default deadline (seconds) for reaching the broker, and again for reading the topic to its end.
DEFAULT_TIMEOUT_S = 10.0

EXIT_CODES = """exit codes: 0 at least one model was found; 1 no model (for --model-id, if given);
2 the file cannot be read or holds a schema version this reader does not know; 5 the broker
did not answer within --timeout-s seconds; 7 the broker refused access (authentication failed, or
the user may not read the topic: the message names the grant)"""

PROG = "stream-vips inspect"


class BrokerUnreachable(StreamVipsError, RuntimeError):
    """The broker did not answer within the deadline (exit code 5)."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``inspect`` on an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "inspect", help="print the latest model per id on a model topic or in a JSONL model file",
        description=textwrap.fill("Print the latest published model per id, with its privacy report (human-readable "
                    "or --json), from a Kafka model topic (--bootstrap, --topic) or a JSONL model file "
                    "(--file) as written by stream-vips demo and run.", 92),
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers, host:port[,host:port]")
    where.add_argument("--file", metavar="FILE", help="JSONL model file (one model message per line)")
    p.add_argument("--topic", default="stream-vips-models", help="model topic (default: %(default)s)")
    p.add_argument("--model-id", help="only this model id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout-s", "--timeout", dest="timeout_s", type=float, default=DEFAULT_TIMEOUT_S,
                   metavar="S", help="seconds for the broker to answer, and again for reading the topic to "
                                     "its end (default: %(default)s)")
    return p


def summary(msg: Mapping[str, Any]) -> dict[str, Any]:
    """What ``inspect`` shows of one message: identity, shapes and the privacy report."""
    return {
        "model_id": msg["model_id"],
        "family": msg["family"],
        "version": msg["version"],
        "created_at": msg["created_at"],
        "schema_version": msg["schema_version"],
        "hyperparameters": msg["hyperparameters"],
        "natural_parameters": {k: {"dtype": v["dtype"], "shape": v["shape"]}
                               for k, v in msg["natural_parameters"].items()},
        "privacy": dict(msg["privacy"]),
    }


def privacy_line(p: Mapping[str, Any]) -> str:
    """One line on what a privacy report guarantees (a non-private report claims nothing)."""
    if p.get("private") is False or p.get("epsilon_spent") is None:
        return "privacy: NONE (a non-private run: no noise, no ledger, no guarantee)"
    unit = (f"per key (at most {p.get('max_records_per_key')} records of one key)" if p.get("unit") == "key"
            else "per record")
    if p.get("accounting") == "window":
        unit += f", over the at most {p.get('window_steps')} steps a record is in (window accounting)"
    return (f"privacy: epsilon {p['epsilon_spent']:.6g} of {p['epsilon_budget']:.6g} {unit} "
            f"(delta {p['delta']:.3g}, {p['adjacency']}, accountant {p['accountant']}"
            + (f", ledger {p['ledger_id']}" if p.get("ledger_id") else "") + ")")


def format_text(summaries: list[dict[str, Any]]) -> str:
    """The human-readable listing: four lines per model."""
    lines = []
    for s in summaries:
        p = s["privacy"]
        if p.get("private") is False:
            state = "non-private, finished" if p["halted"] else "non-private"
        else:
            state = "HALTED (budget spent)" if p["halted"] else "updating"
        lines.append(f"model {s['model_id']}  family {s['family']}  version {s['version']}  "
                     f"created {s['created_at']}  [{state}]")
        lines.append(f"  {privacy_line(p)}")
        lines.append(f"  release: {p['steps']} steps, {p['sampling']} sampling q={p['q']:.6g}, "
                     f"noise multiplier z={p['noise_multiplier']:.6g} (paper sigma {p['paper_sigma']:.6g})"
                     + ("  SEEDED NOISE: not for production" if p["seeded"] else ""))
        shapes = ", ".join(f"{k}{tuple(v['shape'])}" for k, v in s["natural_parameters"].items())
        lines.append(f"  natural parameters: {shapes}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# JSONL model files

_MODEL_ID = re.compile(rb'"model_id"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _check(msg: Any) -> dict[str, Any]:
    from stream_vips.client import check_message

    return check_message(msg)


def latest_in_file(path: str | os.PathLike[str], model_id: str | None = None
                   ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``({model_id: latest valid message}, [why each skipped line was skipped])`` of a JSONL
    model file, read from its end (see the module docstring). With ``model_id`` the scan stops
    at that id's latest message. A schema version newer than this reader's raises
    :class:`~stream_vips.client.SchemaVersionError` (a line without one is skipped as invalid);
    ``OSError`` if the file cannot be read."""
    from stream_vips import messages
    from stream_vips.client import SchemaVersionError
    from stream_vips.io import reverse_lines

    latest: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for line, torn in reverse_lines(path):
        found = _MODEL_ID.search(line)
        if found is not None:
            try:
                key = json.loads(b'"' + found.group(1) + b'"')
            except ValueError:
                key = None
            if key in latest or (model_id is not None and key != model_id):
                continue  # an older message of an id already resolved, or another id
        raw: Any = None
        try:
            raw = messages.loads(line, validate=False)
            msg = _check(raw)
        except SchemaVersionError:
            version = raw.get("schema_version") if isinstance(raw, dict) else None
            if isinstance(version, int) and version > messages.SCHEMA_VERSION:
                raise  # a newer format: upgrade the reader rather than misread the latest model
            skipped.append(f"a line without a known schema_version ({version!r})")
            continue
        except messages.MessageError as exc:
            skipped.append("a torn last line (no newline)" if torn else str(exc))
            continue
        except RecursionError:  # json's parser ran out of stack: invalid like any other bad line
            skipped.append("model message is not valid JSON: nested too deeply")
            continue
        if msg["model_id"] in latest or (model_id is not None and msg["model_id"] != model_id):
            continue
        latest[msg["model_id"]] = msg
        if model_id is not None:
            break
    return latest, skipped


# ---------------------------------------------------------------------------------------------
# Kafka topics


def error_text(exc: BaseException) -> str:
    """``Type: message`` once (kafka-python's errors already start with their class name)."""
    name = type(exc).__name__
    text = str(exc)
    while text.startswith(f"{name}: "):
        text = text[len(name) + 2:]
    return f"{name}: {text}" if text else name


def deadline_options(timeout_s: float) -> dict[str, Any]:
    """kafka-python settings that make a reader give up on an unreachable broker within about
    ``timeout_s`` seconds (its own defaults wait 30 s to bootstrap, per request)."""
    ms = max(100, int(timeout_s * 1000))
    return {"bootstrap_timeout_ms": ms, "request_timeout_ms": ms, "reconnect_backoff_max_ms": min(1000, ms)}


def within(timeout_s: float, work: Callable[[], Any], what: str) -> Any:
    """``work()`` with a hard deadline: run in a daemon thread, and :class:`BrokerUnreachable`
    after ``timeout_s`` (plus a second of grace) if it has not returned. The client's own
    timeouts (:func:`deadline_options`) normally end it first; this also bounds what they do not
    cover (a slow name lookup, a broker that accepts connections and never answers)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="stream-vips-deadline", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if thread.is_alive():
        raise BrokerUnreachable(f"{what}: no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def open_reader(bootstrap: str, topic: str, timeout_s: float, reader_class: type | None = None) -> Any:
    """A :class:`~stream_vips.client.ModelReader` (or ``reader_class``) on ``topic`` that gives
    up on an unreachable broker within ``timeout_s``: :class:`BrokerUnreachable` naming it."""
    from connectors.kafka import KafkaConnectorError, security_options
    from stream_vips.client import ModelReader

    cls = reader_class or ModelReader
    security = {**security_options(), **deadline_options(timeout_s)}  # KafkaConnectorError: bad settings
    where = f"cannot reach the Kafka broker at {bootstrap}"
    try:
        return within(timeout_s * 2, lambda: cls(bootstrap, topic, security=security), where)
    except (KafkaConnectorError, ValueError):
        raise
    except BrokerUnreachable:
        raise
    except Exception as exc:  # the client's own errors: the broker did not answer in time
        raise BrokerUnreachable(f"{where} within {timeout_s:g} s ({error_text(exc)})") from None


def read_topic_to_end(reader: Any, timeout_s: float) -> bool:
    """Read ``reader``'s topic to its end for at most ``timeout_s``; False if the deadline cut it."""
    started = time.monotonic()
    within(timeout_s, lambda: reader.poll(timeout_s=timeout_s), f"reading {reader.topic!r}")
    return time.monotonic() - started < timeout_s


def latest_on_topic(bootstrap: str, topic: str, timeout_s: float) -> dict[str, dict[str, Any]]:
    """``{model_id: latest message}`` on ``topic``; :class:`BrokerUnreachable` past the deadline."""
    reader = open_reader(bootstrap, topic, timeout_s)
    try:
        if not read_topic_to_end(reader, timeout_s):
            print(f"{PROG}: warning: stopped reading {topic!r} after {timeout_s:g} s; a newer model may "
                  "exist (raise --timeout-s)", file=sys.stderr)
        return reader.latest()
    finally:
        reader.close()


def run(args: argparse.Namespace) -> int:
    """See :data:`EXIT_CODES`."""
    from stream_vips.messages import MessageError

    def fail(line: str, code: int) -> int:
        print(f"{PROG}: {line}", file=sys.stderr)
        return code

    if not args.timeout_s > 0:
        return fail(f"--timeout-s must be > 0, got {args.timeout_s!r}", 2)
    where = args.file if args.file is not None else args.topic
    try:
        if args.file is not None:
            latest, skipped = latest_in_file(args.file, args.model_id)
            if skipped:
                print(f"{PROG}: skipped {len(skipped)} invalid line(s) in {args.file} (latest: {skipped[0]})",
                      file=sys.stderr)
        else:
            from connectors.kafka import KafkaAccessDenied, KafkaConnectorError

            try:
                latest = latest_on_topic(args.bootstrap, args.topic, args.timeout_s)
            except KafkaAccessDenied as exc:
                return fail(str(exc), 7)
            except KafkaConnectorError as exc:
                return fail(str(exc), 2)
    except BrokerUnreachable as exc:
        return fail(str(exc), 5)
    except OSError as exc:
        return fail(f"cannot read {args.file}: {exc.strerror or exc}", 2)
    except (ValueError, MessageError) as exc:
        return fail(str(exc), 2)
    if args.model_id is not None:
        latest = {k: v for k, v in latest.items() if k == args.model_id}
    summaries = [summary(latest[k]) for k in sorted(latest)]
    if args.json:
        source = {"file": args.file} if args.file is not None else {"topic": args.topic}
        print(json.dumps({**source, "models": summaries}, indent=2, sort_keys=True))
    elif summaries:
        print(format_text(summaries))
    if not summaries:
        return fail(f"no model{' ' + repr(args.model_id) if args.model_id else ''} in {where!r}", 1)
    return 0
