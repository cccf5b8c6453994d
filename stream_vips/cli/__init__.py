"""The ``stream-vips`` command: one module per subcommand in this package, registered here.

:data:`SUBCOMMANDS` is the one registry: each subcommand's module (exposing
``add_parser(subparsers)`` and ``run(args) -> int``) and its one-line help. The top-level help is
built from that table alone, and only the chosen subcommand's module is imported, so
``stream-vips --help`` never loads numpy, the models or the Kafka client, and one missing optional
piece never breaks the other subcommands.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence

from stream_vips import __version__

#: subcommand -> (module with add_parser(subparsers) and run(args) -> int, one-line help).
#: The only place a subcommand is registered; the help line is shown by ``stream-vips --help``
#: without importing the module.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("stream_vips.cli.run", "run the pipeline from a YAML configuration"),
    "demo": ("stream_vips.cli.demo", "run the pipeline on a synthetic stream (no Kafka needed)"),
    "plan": ("stream_vips.cli.plan", "epsilon for a noise multiplier, or the noise multiplier for a target epsilon"),
    "inspect": ("stream_vips.cli.inspect",
                "print the latest model per id on a model topic or in a JSONL model file"),
    "reset": ("stream_vips.cli.reset", "start a new privacy budget deliberately (the old ledger is kept and named)"),
    "fit": ("stream_vips.cli.fit", "fit a model to a finite JSONL data set, spending the whole privacy budget"),
    "report": ("stream_vips.cli.report",
               "write a privacy and model report (PNG and HTML) from a ledger and the published models"),
    "config": ("stream_vips.cli.config_cmd",
               "print the effective configuration after environment overrides (secrets redacted)"),
    "topics": ("stream_vips.cli.topics", "create or check every Kafka topic a configuration names"),
}


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
