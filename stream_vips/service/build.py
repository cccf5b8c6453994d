"""The only place that picks connectors and ledgers from a configuration.

:func:`check` completes what :mod:`stream_vips.config` (the schema) cannot know: the model's
parameters (through :func:`stream_vips.core.build.model_params`), each connector's ``type`` and
options against its constructor, and a Kafka ledger's options; every refusal is a
:class:`~stream_vips.errors.ConfigError` naming its key, at start, before anything is spent.
:func:`load_config` and :func:`config_from_dict` are the schema and these checks in one call
(the public :func:`stream_vips.load_config`). :func:`connector` and :func:`ledger` build the parts.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from connectors import REGISTRIES, connector_class
from stream_vips import config as schema
from stream_vips.config import Config, check_kwargs
from stream_vips.core import build as core_build
from stream_vips.errors import ConfigError
from stream_vips.privacy.ledger import Ledger

#: Ledger types and where each is opened: the core opens memory and file ledgers, the Kafka
#: connectors the Kafka ledger.
LEDGERS: dict[str, str] = {"memory": "core", "file": "core", "kafka": "connectors.kafka:KafkaLedger"}
SECTIONS = ("source", "sink", "dead_letter")


def check(cfg: Config) -> Config:
    """``cfg`` with its model parameters, connector options and ledger options checked (and the
    model's defaults filled in); :class:`ConfigError` naming the key of the first refusal."""
    for kind in SECTIONS:
        section = getattr(cfg, kind)
        cls = _connector_class(kind, section.type)
        section.options = check_kwargs(cls, section.options, kind)
    led = cfg.privacy.ledger
    if led.type not in LEDGERS:
        raise ConfigError(f"privacy.ledger.type: unknown ledger type {led.type!r} "
                          f"(known: {', '.join(sorted(LEDGERS))})")
    if led.type == "kafka":
        led.options = check_kwargs(_kafka_ledger(), led.options, "privacy.ledger.options")
    cfg.model.params = core_build.model_params(cfg)
    return cfg


def config_from_dict(data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> Config:
    """A configuration from its YAML layout after ``env`` overrides, every part checked."""
    return check(schema.config_from_dict(data, env))


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """The configuration in the YAML file ``path`` (``None``: the defaults), every part checked."""
    return check(schema.load_config(path, env))


def connector(kind: str, cfg: Config) -> Any:
    """The configured ``kind`` of connector (``source``, ``sink``, ``dead_letter``), built."""
    section = getattr(cfg, kind)
    try:
        return _connector_class(kind, section.type)(**section.options)
    except (TypeError, ValueError, OSError) as exc:
        raise ConfigError(f"{kind}: {exc}") from exc


def ledger(cfg: Config) -> Ledger:
    """The configured ledger, opened (a Kafka ledger is named by its ``name`` or the model id)."""
    led = cfg.privacy.ledger
    if LEDGERS.get(led.type) == "core":
        return core_build.ledger(cfg)
    if led.type == "kafka":
        return _kafka_ledger()(**{"ledger_id": cfg.model.id, **led.options})
    raise ConfigError(f"privacy.ledger.type: unknown ledger type {led.type!r} (known: {', '.join(sorted(LEDGERS))})")


class ShardConnector:
    """Shard i's connector of one kind (picklable, so a Ray actor builds its own): a Kafka source
    assigned the partitions p with p mod N = i, laid out for ``partitions`` in all; another
    connector with its configured options (a file path gets the shard's suffix). One that cannot
    be opened is refused naming the key (:func:`_open`)."""

    def __init__(self, kind: str, cfg: Config, partitions: int | None = None) -> None:
        self.kind, self.type, self.options = kind, getattr(cfg, kind).type, dict(getattr(cfg, kind).options)
        self.shards, self.partitions = cfg.runtime.shards, partitions

    def __call__(self, index: int) -> Any:
        options = dict(self.options)
        if self.kind == "source" and self.partitions is not None:
            owned = [p for p in range(self.partitions) if p % self.shards == index]
            options.update(partitions=owned, expected_partitions=self.partitions)
        elif "path" in options and self.shards > 1:
            stem, dot, ext = str(options["path"]).rpartition(".")
            options["path"] = f"{stem}.shard{index}.{ext}" if dot else f"{options['path']}.shard{index}"
        return functools.partial(_open, self.kind, _connector_class(self.kind, self.type), **options)


def _open(kind: str, cls: type, /, **options: Any) -> Any:
    """A shard's ``kind`` of connector, opened where the shard runs; what cannot be opened (a
    dead-letter file whose directory cannot be made, or a directory) is refused naming the key, as
    :func:`connector` refuses it for one process (a :class:`ConfigError`, before anything is spent)."""
    try:
        return cls(**options)
    except OSError as exc:
        where = f"{kind}.path: cannot open {options['path']}" if "path" in options else kind
        raise ConfigError(f"{where}: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{kind}: {exc}") from exc


def shard_connectors(cfg: Config) -> tuple[ShardConnector, ShardConnector]:
    """The shards' sources and dead-letter sinks (``runtime.shards``; privacy rule 14). More than
    one shard needs a Kafka source with at least as many partitions as shards, every input topic
    with the same count (refused at start naming the key)."""
    n = cfg.runtime.shards
    if n == 1:
        return ShardConnector("source", cfg), ShardConnector("dead_letter", cfg)
    if cfg.source.type in FILE_SOURCES:
        return _file_shards(cfg), ShardConnector("dead_letter", cfg)
    if cfg.source.type != "kafka":
        raise ConfigError(f"source.type: runtime.shards: {n} needs a partitioned source (kafka, or jsonl files "
                          f"split by shard), not {cfg.source.type!r}")
    if cfg.privacy.accounting == "window":
        raise ConfigError("privacy.accounting: window accounting needs every record at one stream position across "
                          "restarts (a checkpoint per shard, one partition per shard), which the sharded service "
                          "does not provide yet; use stream accounting")
    cls = _connector_class("source", "kafka")
    options = dict(cfg.source.options)
    try:
        counts = cls.partition_counts(options.pop("topics"), **options)
    except Exception as exc:  # noqa: BLE001 - a refused start names the key and the cause
        raise ConfigError(f"source: cannot read the input topics' partition counts: {exc}") from exc
    if len(set(counts.values())) != 1:
        raise ConfigError(f"source.options.topics: sharded input topics need one partition count, got {counts}")
    partitions = next(iter(counts.values()))
    if partitions < n:
        raise ConfigError(f"runtime.shards: {n} shards need at least {n} input partitions; {counts} has {partitions}")
    return ShardConnector("source", cfg, partitions), ShardConnector("dead_letter", cfg)


#: file sources a sharded run reads as one file per shard (``path`` with ``.shard<i>`` before the extension)
FILE_SOURCES = ("jsonl",)


def _file_shards(cfg: Config) -> ShardConnector:
    """Shard i reads ``source.path`` with ``.shard<i>`` before the extension (one file per
    partition, split beforehand). Refused at start, naming the key: a missing file, a privacy key
    other than a record (a line has no message key), and shard checkpoints (a file source cannot
    seek back to a checkpoint's position, so a restart would admit the same records again)."""
    n = cfg.runtime.shards
    if cfg.privacy.unit == "key":
        raise ConfigError("privacy.unit: key with runtime.shards > 1 needs the Kafka message key as the privacy key; "
                          f"a {cfg.source.type} source has none")
    if cfg.runtime.checkpoint_path is not None:
        raise ConfigError(f"runtime.checkpoint_path: a {cfg.source.type} source split by shard cannot seek to a "
                          "checkpoint's position, so a restored shard would admit its records again")
    if cfg.privacy.accounting == "window":
        raise ConfigError("privacy.accounting: window accounting is not available with runtime.shards > 1; "
                          "use stream accounting")
    sources = ShardConnector("source", cfg)
    for i in range(n):
        path = sources(i).keywords["path"]
        if not os.path.isfile(path):
            raise ConfigError(f"source.path: runtime.shards: {n} reads one file per shard, and {path} is not a file")
    return sources


def _connector_class(kind: str, type_name: str) -> type:
    if type_name not in REGISTRIES[kind]:
        raise ConfigError(f"{kind}.type: unknown {kind} type {type_name!r} "
                          f"(known: {', '.join(sorted(REGISTRIES[kind]))})")
    try:
        return connector_class(kind, type_name)
    except ImportError as exc:
        raise ConfigError(f"{kind}.type: connector {type_name!r} is not available: {exc}") from None


def _kafka_ledger() -> type:
    try:
        from connectors.kafka import KafkaLedger
    except ImportError as exc:
        raise ConfigError(f"privacy.ledger.type: the kafka ledger is not available: {exc}") from None
    return KafkaLedger
