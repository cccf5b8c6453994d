"""``stream-vips config``: the effective configuration, after environment overrides, as YAML or JSON.

Loads the configuration exactly as ``stream-vips run`` does (the file, or the built-in defaults,
then every ``STREAM_VIPS__SECTION__KEY`` override, then validation) and prints every key with its
effective value, so an operator sees what a run would use. YAML output starts with comments
naming the overrides that came from the environment and the ``STREAM_VIPS_KAFKA_*`` security
variables that are set (the Kafka connectors fall back to them).

Secrets are never printed. A value is replaced by ``<redacted>`` when its key, at any depth,
matches :data:`stream_vips.logsafety.SECRET_KEY` (the one rule; configuration errors and the Kafka
client's log lines follow it too): it contains ``password``, ``secret``, ``token`` or
``credential``, or is ``key`` or ends in ``_key`` (``api_key``, ``private_key``). Paths to files
that hold secrets (``ssl_keyfile``, ``ssl_certfile``, ``ssl_cafile``, ``sasl_password_file`` and
every other ``*_file``) and user names are shown: they name where a secret is, not the secret.
The same rule applies to the environment variables listed in the comments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

PROG = "stream-vips config"

EXIT_CODES = "exit codes: 0 printed; 2 bad configuration (the message names the key)"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``config`` on an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "config", help="print the effective configuration after environment overrides (secrets redacted)",
        description=textwrap.fill("Print the configuration that stream-vips run would use: the file (or the built-in "
                    "defaults) with every STREAM_VIPS__SECTION__KEY environment override applied and "
                    "validated. Values of keys named like password, secret, token, credential or *_key "
                    "are printed as <redacted>; file paths such as ssl_keyfile are shown.", 92),
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="YAML configuration (default: built-in defaults)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of YAML")
    return p


def redact(data: Any) -> Any:
    """``data`` with the value of every secret key replaced by ``<redacted>`` (a copy), at any
    depth; ``None`` (not set) stays ``None`` so that an unset secret is visible as unset."""
    from stream_vips.logsafety import REDACTED, is_secret

    if isinstance(data, Mapping):
        return {k: (REDACTED if is_secret(str(k)) and v is not None else redact(v)) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact(v) for v in data]
    return data


def environment_notes(env: Mapping[str, str]) -> list[str]:
    """Comment lines: which overrides and Kafka security variables the environment sets."""
    from connectors.kafka.connection import ENV_PREFIX as KAFKA_PREFIX
    from stream_vips.config import ENV_PREFIX
    from stream_vips.logsafety import REDACTED, is_secret

    notes = []
    for name in sorted(env):
        if name.startswith(ENV_PREFIX):
            key = ".".join(part.lower() for part in name[len(ENV_PREFIX):].split("__"))
            value = REDACTED if is_secret(key.rsplit(".", 1)[-1]) else env[name]
            notes.append(f"override from the environment: {key} = {value} ({name})")
        elif name.startswith(KAFKA_PREFIX):
            value = REDACTED if is_secret(name[len(KAFKA_PREFIX):]) else env[name]
            notes.append(f"Kafka connector fallback set: {name}={value}")
    return notes


def effective(path: str | None, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The validated configuration after overrides, in its YAML layout, secrets redacted.
    Raises :class:`~stream_vips.config.ConfigError` naming a bad key."""
    from stream_vips.service.build import load_config

    return redact(load_config(path, env).to_dict())


def run(args: argparse.Namespace) -> int:
    """See :data:`EXIT_CODES`."""
    import yaml

    from stream_vips.config import ConfigError

    env = dict(os.environ)
    try:
        data = effective(args.config, env)
    except ConfigError as exc:
        print(f"{PROG}: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    source = args.config if args.config is not None else "built-in defaults"
    header = [f"effective stream-vips configuration from {source}"]
    header += environment_notes(env)
    print("\n".join(f"# {line}" for line in header))
    print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), end="")
    return 0

