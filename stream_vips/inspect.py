"""``stream-vips inspect``: the latest published model per id with its privacy report.

Reads the model topic with :class:`~stream_vips.client.ModelReader` (read_committed, chunked
messages reassembled, schema checked) up to its current end and prints, per model id, the
version, family, parameter shapes and privacy report; ``--json`` prints the same as one JSON
object (natural parameters as shapes only: the arrays stay on the topic). Security settings come
from ``STREAM_VIPS_KAFKA_*`` environment variables, as for the connectors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Mapping

PRIVACY_FIELDS = ("epsilon_spent", "epsilon_budget", "delta", "accountant", "sampling", "q",
                  "noise_multiplier", "paper_sigma", "adjacency", "steps", "halted", "seeded")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("inspect", help="print the latest model per id on a model topic",
                              description="Print the latest published model per id on a model topic, with "
                                          "its privacy report (human-readable or --json).")
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,host:port]")
    p.add_argument("--topic", default="stream-vips-models", help="model topic (default: %(default)s)")
    p.add_argument("--model-id", help="only this model id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to read to the end (default: %(default)s)")
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


def format_text(summaries: list[dict[str, Any]]) -> str:
    lines = []
    for s in summaries:
        p = s["privacy"]
        state = "HALTED (budget spent)" if p["halted"] else "updating"
        lines.append(f"model {s['model_id']}  family {s['family']}  version {s['version']}  "
                     f"created {s['created_at']}  [{state}]")
        lines.append(f"  privacy: epsilon {p['epsilon_spent']:.6g} of {p['epsilon_budget']:.6g} "
                     f"(delta {p['delta']:.3g}, {p['adjacency']}, accountant {p['accountant']})")
        lines.append(f"  release: {p['steps']} steps, {p['sampling']} sampling q={p['q']:.6g}, "
                     f"noise multiplier z={p['noise_multiplier']:.6g} (paper sigma {p['paper_sigma']:.6g})"
                     + ("  SEEDED NOISE: not for production" if p["seeded"] else ""))
        shapes = ", ".join(f"{k}{tuple(v['shape'])}" for k, v in s["natural_parameters"].items())
        lines.append(f"  natural parameters: {shapes}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when at least one model was found, 1 when none, 2 when the topic cannot be read."""
    from connectors.kafka import KafkaConnectorError
    from stream_vips.client import ModelReader
    from stream_vips.messages import MessageError

    try:
        with ModelReader(args.bootstrap, args.topic) as reader:
            reader.poll(timeout_s=args.timeout)
            latest = reader.latest()
    except (ValueError, KafkaConnectorError, MessageError) as exc:
        print(f"stream-vips inspect: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a broker that cannot be reached: say so instead of a traceback
        print(f"stream-vips inspect: cannot read {args.topic!r} from {args.bootstrap}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.model_id is not None:
        latest = {k: v for k, v in latest.items() if k == args.model_id}
    summaries = [summary(latest[k]) for k in sorted(latest)]
    if args.json:
        print(json.dumps({"topic": args.topic, "models": summaries}, indent=2, sort_keys=True))
    elif summaries:
        print(format_text(summaries))
    if not summaries:
        print(f"stream-vips inspect: no model{' ' + repr(args.model_id) if args.model_id else ''} "
              f"on {args.topic!r}", file=sys.stderr)
        return 1
    return 0
