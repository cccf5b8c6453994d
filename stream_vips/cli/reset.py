"""``stream-vips reset``: start a new privacy budget deliberately, on record.

A start refuses state (a reservoir checkpoint, a published model) that the configured ledger did
not pay for: that is what a deleted, replaced or rolled-back ledger looks like, and accepting it
would silently reset the spent budget. When an operator decides that a new budget is right (for
example the old data will never be processed again), this command writes a new ledger whose
genesis lists every ledger id that the existing state names (``supersedes``), so later starts
accept that state and the decision stays visible in the ledger itself. A file ledger that exists
is kept next to the new one as ``<path>.superseded-<time>`` (``-2``, ``-3``, ... appended when
that name is taken: a kept ledger is never overwritten); a Kafka ledger needs a new
``privacy.ledger.options.name`` (its old records stay on the topic).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

EXIT_CODES = """exit codes: 0 a new ledger was written; 2 bad configuration, a memory ledger, or no --yes
(nothing done); 3 another process holds the ledger (a running pipeline: stop it first; nothing
done)"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "reset", help="start a new privacy budget deliberately (the old ledger is kept and named)",
        description="Write a new ledger whose genesis supersedes the ledgers named by the existing "
                    "checkpoint, published model and ledger, so that a start accepts that state. "
                    "Spending the budget again on the same records weakens their protection: "
                    "reset only when that is intended.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="YAML configuration of the pipeline")
    p.add_argument("--yes", action="store_true", help="confirm that a new budget starts")
    return p


def superseded_ids(config) -> set[str]:
    """Ledger ids named by the state this configuration would start from."""
    from connectors import build_connector
    from stream_vips.service.checkpoint import Checkpoint, CheckpointError

    ids: set[str] = set()
    if config.runtime.checkpoint_path:
        try:
            state = Checkpoint(config.runtime.checkpoint_path).load()
        except CheckpointError:
            state = None
        if state and state.get("ledger_id"):
            ids.add(state["ledger_id"])
    sink = build_connector("sink", config.sink.type, config.sink.options)
    try:
        latest = getattr(sink, "latest", None)
        message = latest(config.model.id) if latest else None
    finally:
        sink.close()
    if message and message.get("privacy", {}).get("ledger_id"):
        ids.add(message["privacy"]["ledger_id"])
    return ids


def keep_aside(path: Path, stamp: str) -> Path:
    """Move the ledger at ``path`` to ``<path>.superseded-<stamp>`` (``-2``, ``-3``, ... when that
    name exists, e.g. two resets in one second) and return the new name. A hard link never
    replaces an existing name, unlike a rename, so no kept ledger is ever overwritten."""
    from stream_vips.privacy.ledger import fsync_dir

    for n in itertools.count(1):
        kept = path.with_name(f"{path.name}.superseded-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            os.link(path, kept)
        except FileExistsError:
            continue
        os.unlink(path)
        fsync_dir(path.parent)
        return kept


def run(args: argparse.Namespace) -> int:
    """See :data:`EXIT_CODES`."""
    from stream_vips.config import ConfigError
    from stream_vips.privacy.ledger import FileLedger, LedgerCorrupt, LedgerLocked
    from stream_vips.service.build import load_config

    if not args.yes:
        print("stream-vips reset: nothing done; pass --yes to start a new privacy budget", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"stream-vips: configuration error: {exc}", file=sys.stderr)
        return 2
    ledger_cfg = config.privacy.ledger
    if ledger_cfg.type == "memory":
        print("stream-vips reset: a memory ledger starts new on every run; nothing to reset", file=sys.stderr)
        return 2
    if ledger_cfg.type == "file":
        path = Path(ledger_cfg.path)
        old = None
        if path.exists():
            try:
                old = FileLedger(path)  # held while it is moved, so no run can start spending from it
            except LedgerCorrupt:
                pass  # kept aside all the same; its id may be unreadable
            except LedgerLocked as exc:
                print(f"stream-vips reset: refusing: {exc} (stop it first); nothing was changed", file=sys.stderr)
                return 3
        try:
            ids = superseded_ids(config)
            if old is not None:
                ids.add(old.ledger_id)
                ids.update(old.supersedes)
            if path.exists():
                kept = keep_aside(path, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
                print(f"stream-vips reset: kept the old ledger as {kept}", file=sys.stderr)
        finally:
            if old is not None:
                old.close()
        with FileLedger(path, supersedes=ids) as new:
            new_id = new.ledger_id
    else:
        from connectors.kafka import KafkaLedger

        ids = superseded_ids(config)
        try:
            new = KafkaLedger(**{"ledger_id": config.model.id, **ledger_cfg.options, "supersedes": sorted(ids)})
        except LedgerCorrupt as exc:
            print(f"stream-vips reset: {exc} (set privacy.ledger.options.name)", file=sys.stderr)
            return 2
        new_id = new.ledger_id
        new.close()
    print(f"stream-vips reset: new ledger {new_id} supersedes {', '.join(sorted(ids)) or 'nothing'}",
          file=sys.stderr)
    return 0
