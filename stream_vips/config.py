"""Configuration: one YAML file plus ``STREAM_VIPS__SECTION__KEY`` environment overrides.

Every knob has a default that serves, so an empty file is a valid configuration (the embedded
synthetic demo). Validation happens once, at start: an unknown key, a wrong type or a bad value
raises :class:`ConfigError` naming the dotted key. Everything that shapes a release (reservoir
size M, batch size S and rate q = S/M, noise multiplier z, the model's clipping bounds and
dataset size) lives here and never depends on the data (privacy rule 5 in docs/privacy.md).

Connector sections (``source``, ``sink``, ``dead_letter``) hold a ``type`` plus that
connector's constructor keyword arguments; ``model.params`` holds the model family's
constructor keyword arguments. This module knows neither connectors nor models: the service
checks the connector options (:func:`stream_vips.service.build.check`) and the core the model's
(:func:`stream_vips.core.build.model_params`: a parameter named ``dataset_size``, the public N of
the M-step, defaults to the reservoir capacity), both at start, each naming the key it refuses;
:func:`stream_vips.load_config` and :func:`stream_vips.config_from_dict` do all of it at once.

Length: a little over 600 lines, one module: the sections' dataclasses are the schema,
and reading values into them (types, environment overrides) and the checks across sections all
name the same dotted keys and defaults; it is the one place an operator's key is defined,
read and refused. Split apart, a key's type, default and checks would sit in different files.

>>> cfg = config_from_dict({"privacy": {"epsilon": 2.0}}, env={"STREAM_VIPS__SAMPLING__RESERVOIR": "500",
...                                                             "STREAM_VIPS__SAMPLING__BATCH_SIZE": "50"})
>>> cfg.privacy.epsilon, cfg.sampling.reservoir, cfg.sampling.q
(2.0, 500, 0.1)
>>> try:
...     config_from_dict({"privacy": {"epsilom": 2.0}}, env={})
... except ConfigError as exc:
...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
privacy.epsilom: unknown key (known: accountant, accounting, block_weights, calibration_rtol, delta, epsilon,
key_field, ledger, max_records_per_key, mode, noise_multiplier, planned_steps, seed, unit)
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from stream_vips.errors import ConfigError
from stream_vips.logsafety import REDACTED, is_secret  # the one rule for what is a secret
from stream_vips.privacy.accountants import MIN_NOISE_MULTIPLIER
from stream_vips.privacy.calibration import MIN_CALIBRATION_RTOL

ENV_PREFIX = "STREAM_VIPS__"
#: Largest privacy.epsilon. Beyond 709.78 e^epsilon, the likelihood-ratio bound an (epsilon,
#: delta) guarantee states, is not even a finite float64, so such a budget bounds nothing; it is
#: still allowed up to 1e4 as "never halt" for experiments and benchmarks, where calibration
#: stays above MIN_NOISE_MULTIPLIER (z = 0.015 for one full-batch step), while targets like 1e300
#: drove calibration into the accountant's overflow. With a fixed noise multiplier nothing is
#: calibrated and any finite budget is allowed (the audits use 1e300: never halt).
MAX_EPSILON = 1e4

def _secret_path(key: str) -> bool:
    """Whether any part of the dotted ``key`` (``source.sasl_password``, ``a.tokens[0]``) names a
    secret: a wrongly typed or malformed password is still a password."""
    return any(is_secret(part) for part in re.split(r"[.\[]", key))


def _shown(value: Any, key: str) -> str:
    """``repr(value)`` for an error about the dotted ``key``, ``<redacted>`` for a secret.

    >>> _shown(90210773, "source.sasl_password"), _shown(3, "sampling.reservoir")
    ('<redacted>', '3')
    """
    return REDACTED if _secret_path(key) else repr(value)


#: A quoted part of a YAML parser message: group 1 when it names a token (``'<stream end>'``, one
#: punctuation mark, an escape such as ``'\t'``), else text of the document.
_QUOTED = re.compile(r"'(<[a-z ]+>|[^\w\s]|\\[a-z])'|'[^']*'|\"[^\"]*\"")


def _yaml_problem(exc: Exception, text: str) -> str:
    r"""One line saying where and why ``text`` is not YAML, without the parser's snippet.

    PyYAML's message quotes the offending lines; they may hold a password, so only the position
    and the parser's reason are kept, the reason is withheld when a line it concerns names a
    secret key, and text the reason quotes from the document (an alias name) is cut out. Any
    other exception is what a value's constructor raised (a ValueError for ``!!int abc`` or the
    date ``2024-13-45``, a KeyError for ``!!bool abc``, a RecursionError 3,000 levels deep): its
    message quotes the value, so only its type is given.

    >>> try:
    ...     yaml.safe_load('a:\n  sasl_password: "hunter2\n')
    ... except yaml.YAMLError as exc:
    ...     print(_yaml_problem(exc, 'a:\n  sasl_password: "hunter2\n'))
    line 2, column 18: <redacted> (the line names a secret)
    """
    if not isinstance(exc, yaml.YAMLError):
        return f"a value cannot be built as its type ({type(exc).__name__}; the value is not shown)"
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return "the parser gave no position"
    marks = [m for m in (exc.context_mark, exc.problem_mark) if m is not None]
    lines = text.splitlines()[min(m.line for m in marks):max(m.line for m in marks) + 1]
    where = f"line {marks[0].line + 1}, column {marks[0].column + 1}"
    if any(is_secret(word) for line in lines for word in re.findall(r"[A-Za-z0-9_]+", line)):
        return f"{where}: {REDACTED} (the line names a secret)"
    reason = ", ".join(part for part in (exc.context, exc.problem) if part)
    # a value may sit on a line that does not name its key: quoted text other than a token name
    # ('<stream end>') or one punctuation mark is the document's own and is not repeated
    return f"{where}: " + _QUOTED.sub(lambda m: m.group(0) if m.group(1) else "'...'", reason)


@dataclass
class ModelConfig:
    family: str = "linreg"
    id: str = "default"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class LedgerConfig:
    """Where admitted privacy events are made durable: a local file (``path``), a compacted
    Kafka topic (``options``: :class:`connectors.kafka.KafkaLedger` arguments, e.g.
    ``bootstrap_servers``, ``topic``), or memory (tests only: a restart forgets spent epsilon).

    ``prepay_steps``: how many steps one durable write appends ahead (each step's event is in
    the ledger before its noise, as always; a crash charges at most ``prepay_steps - 1`` unused
    steps). ``null`` chooses ``planned_steps // 100`` clamped to [1, 64] for durable ledgers, so
    a restart wastes at most 1% of the planned steps, and 1 for memory. Steps are prepaid only
    with a pure ``schedule.every_records`` schedule, whose step positions are known ahead.

    ``pay_ahead`` (the service, ``stream-vips run``): once the prepaid steps are used up, write
    the next ones on a background thread while records keep arriving, so a ledger write (an
    fsync, a Kafka transaction) does not stall ingestion; each step still waits until its own
    event is durable before its noise is drawn, and a crash charges at most ``prepay_steps``
    unused steps. Nothing is paid ahead past the end of a source of known length. ``null``
    turns it on for durable ledgers under stream accounting with a pure
    ``schedule.every_records`` schedule; ``PrivateLearner`` and ``fit`` never pay ahead."""

    type: Literal["file", "memory", "kafka"] = "file"
    path: str = "ledger.jsonl"
    options: dict[str, Any] = field(default_factory=dict)
    prepay_steps: int | None = None
    pay_ahead: bool | None = None

    def prepay(self, planned_steps: int) -> int:
        """The effective ``prepay_steps``."""
        if self.prepay_steps is not None:
            return self.prepay_steps
        return 1 if self.type == "memory" else min(64, max(1, planned_steps // 100))

    def paying_ahead(self) -> bool:
        """The effective ``pay_ahead`` of a service (it also needs stream accounting and a stride)."""
        return self.type != "memory" if self.pay_ahead is None else self.pay_ahead


@dataclass
class PrivacyConfig:
    """``mode: non_private`` is the only way to run without noise (z = 0; messages carry
    ``epsilon_spent: null`` and ``private: false``).

    ``noise_multiplier: null`` calibrates z to spend ``epsilon`` at ``delta`` in ``planned_steps``
    steps; the result is at most ``calibration_rtol`` (relative) above the smallest such z.

    ``accounting``: ``stream`` composes every step of the stream (the service halts when the
    budget is spent); ``window`` (with ``sampling.reservoir_policy: window``) bounds each
    record's loss by the L = ceil(M / every_records) steps it can be in, so the budget is per
    record and the service keeps learning (z is calibrated for L steps; ``planned_steps`` is
    not used). See the window reservoir's proof in docs/privacy.md, rule 13.

    ``unit``: ``record`` protects each record (privacy rule 1); ``key`` protects all records of
    one key, i.e. one person, whatever their number (privacy rule 12). The key is the JSON field
    ``key_field`` when it is set (it then wins over the Kafka message key), else the Kafka message
    key. ``sampling.reservoir`` and ``batch_size`` then count key slots and keys, and the
    reservoir holds at most ``max_records_per_key`` records of each key (memory: reservoir x
    max_records_per_key rows).
    """

    mode: Literal["private", "non_private"] = "private"
    epsilon: float = 1.0
    delta: float = 1.0e-5
    noise_multiplier: float | None = None
    calibration_rtol: float = 0.01
    planned_steps: int = 100
    accountant: Literal["auto", "pld", "autodp", "strong"] = "auto"
    accounting: Literal["stream", "window"] = "stream"
    seed: int | None = None
    block_weights: dict[str, float] | None = None
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    unit: Literal["record", "key"] = "record"
    key_field: str | None = None
    max_records_per_key: int = 1


@dataclass
class SamplingConfig:
    """``max_rejected_fraction``: no release while more than this fraction of the reservoir's
    slots hold rejected arrivals (empty slots): a step would spend budget on (almost) nothing, as
    with a wrong ``dim``. Updates then halt with the top rejection reasons. Validity and
    rejection counts are public (privacy rule 1), so the check costs no privacy.

    ``reservoir_policy``: ``uniform`` (Algorithm R over the whole stream) or ``window`` (the last
    ``reservoir`` admitted arrivals; each arrival admitted with probability ``window_rate``, by
    position and the reservoir's RNG only). A window follows a drifting stream.

    ``validation``: ``all`` decodes and validates every arrival; ``admitted`` decides first which
    arrivals the reservoir admits (positions and its RNG only, the same draws) and decodes only
    those, so the reservoir, the steps and the releases are the same as with ``all`` while
    records that never hold a slot are never parsed. Dead letters and rejection metrics then
    cover admitted arrivals only. It needs ``runtime.decode_workers: 0`` and, with
    ``privacy.unit: key``, the Kafka message key (a ``privacy.key_field`` needs decoding first)."""

    method: Literal["poisson", "fixed"] = "poisson"
    reservoir: int = 10_000
    batch_size: int = 1_000
    max_rejected_fraction: float = 0.5
    reservoir_policy: Literal["uniform", "window"] = "uniform"
    window_rate: float = 1.0
    validation: Literal["all", "admitted"] = "all"

    @property
    def q(self) -> float:
        """Sampling rate q = S / M (public)."""
        return self.batch_size / self.reservoir


@dataclass
class ScheduleConfig:
    """``rho_min``: a floor on the Robbins-Monro step size, so a model keeps following a drifting
    stream (about 0.2 to track drift, 0.05 for a stationary stream in a window; 0: no floor)."""

    every_records: int | None = 1_000
    every_seconds: float | None = None
    tau0: float = 100.0
    kappa: float = 0.7
    rho_min: float = 0.0


@dataclass
class ConnectorConfig:
    """A connector ``type`` and its constructor options."""

    type: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class MetricsConfig:
    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = 9108


@dataclass
class RuntimeConfig:
    """``on_halt``: ``stay`` keeps serving metrics and health after the budget is spent (a
    deployment); ``exit`` returns from the run loop (a batch job, the demo).
    ``checkpoint_path``: reservoir + offsets checkpoint written before each source commit (at
    most every ``checkpoint_interval_s``) and restored at start (:mod:`stream_vips.service.checkpoint`;
    needs a seekable source such as Kafka).
    ``publish_interval_s``: 0 publishes every step; > 0 publishes the newest step at most that
    often (plus on halt and shutdown). The default, 1 s, bounds the cost of epsilon reports:
    an exact PLD epsilon for a message is a fresh n-fold composition (10-60 ms), which would
    otherwise cap the update rate. Every step is in the ledger either way; versions may skip.
    ``decode_workers``: 1 decodes and validates each polled batch in a worker process while the
    next is polled (:mod:`stream_vips.core.data.decoding`; it needs a spare core, and on two cores shared
    with a Kafka broker it measured no faster); 0 decodes in the pipeline's process.
    ``dead_letter_max_bytes``: a dead letter carries at most this many bytes of the rejected
    record (plus its full length and sha256), so delivering it never fails for size; keep it
    below the dead-letter topic's ``max.message.bytes``.
    ``source_check_s``: how often a partitioned source (Kafka) is asked which partitions it
    holds and which of its topics are missing (a metadata request); a problem is logged as a
    WARNING at each check while it lasts and exported as metrics.
    ``engine``: ``local`` runs in one process; ``ray`` runs ``shards`` shard actors on a Ray
    cluster, each owning the input partitions p with p mod shards = its index, and a driver that
    alone draws the noise, writes the ledger and publishes (:mod:`stream_vips.distributed`,
    privacy rule 14). ``shards`` > 1 with ``engine: local`` runs the same shards in this process
    (the reference the Ray run must equal). ``shard_timeout_s``: a step whose shards have not all
    answered by then is abandoned before anything is spent."""

    blas_threads: int | None = 1
    poll_max_records: int = 5_000
    poll_timeout_s: float = 0.2
    on_halt: Literal["stay", "exit"] = "stay"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    checkpoint_path: str | None = None
    checkpoint_interval_s: float = 0.0
    publish_interval_s: float = 1.0
    decode_workers: int = 0
    dead_letter_max_bytes: int = 65_536
    source_check_s: float = 30.0
    engine: Literal["local", "ray"] = "local"
    shards: int = 1
    shard_timeout_s: float = 60.0


def _default_source() -> ConnectorConfig:
    return ConnectorConfig("synthetic", {})


def _default_sink() -> ConnectorConfig:
    return ConnectorConfig("jsonl", {"path": "models.jsonl"})


def _default_dead_letter() -> ConnectorConfig:
    return ConnectorConfig("jsonl", {"path": "dead-letters.jsonl"})


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    source: ConnectorConfig = field(default_factory=_default_source)
    sink: ConnectorConfig = field(default_factory=_default_sink)
    dead_letter: ConnectorConfig = field(default_factory=_default_dead_letter)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def to_dict(self) -> dict[str, Any]:
        """The YAML layout of this configuration (connector options flattened next to ``type``)."""
        out = dataclasses.asdict(self)
        for section in ("source", "sink", "dead_letter"):
            conn = out[section]
            out[section] = {"type": conn["type"], **conn["options"]}
        return out


_CONNECTOR_SECTIONS = ("source", "sink", "dead_letter")


# ---------------------------------------------------------------------------------------------
# type checking of plain values against annotations


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check ``value`` against a type annotation, converting where the YAML form is ambiguous.

    ints are accepted for floats; numeric strings are accepted for floats because YAML 1.1
    (PyYAML) reads ``1e-5`` as a string.
    """
    if annotation is Any or annotation is inspect.Parameter.empty:
        return value
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(annotation)}, got {_shown(value, key)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: must be one of {list(args)}, got {_shown(value, key)}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {_shown(value, key)}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {_shown(value, key)}")
        return value
    if annotation is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {_shown(value, key)}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {_shown(value, key)}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be finite, got {_shown(value, key)}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {_shown(value, key)}")
        return value
    if origin in (dict, abc.Mapping) or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {_shown(value, key)}")
        if len(args) == 2:
            return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
        return dict(value)
    if origin in (list, tuple, abc.Sequence, abc.Iterable) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {_shown(value, key)}")
        item = args[0] if args else Any
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(annotation, type) and isinstance(value, annotation):
        return value
    raise ConfigError(f"{key}: expected {_type_name(annotation)}, got {_shown(value, key)}")


def _build_dataclass(cls: type, data: Any, key: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: expected a mapping, got {_shown(data, key)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for name in data:
        if name not in names:
            raise ConfigError(f"{key}.{name}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in data.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[name] = _build_dataclass(hint, value, f"{key}.{name}")
        else:
            kwargs[name] = _coerce(value, hint, f"{key}.{name}")
    return cls(**kwargs)


def close_match(name: str, groups: Mapping[str, abc.Iterable[str]]) -> str:
    """``"; did you mean X (a <group>)?"`` for the name closest to ``name`` among the named groups
    of names (``{"learner option": [...], "logistic model parameter": [...]}``), or ``""``.

    >>> close_match("batchsize", {"learner option": ["batch_size"], "model parameter": ["dim"]})
    '; did you mean batch_size (a learner option)?'
    """
    import difflib

    where = {n: group for group, names in groups.items() for n in names}
    found = difflib.get_close_matches(name, list(where), n=1, cutoff=0.75)
    return f"; did you mean {found[0]} (a {where[found[0]]})?" if found else ""


def check_kwargs(target: type[object] | Callable[..., object], options: Mapping[str, Any],
                 key: str) -> dict[str, Any]:
    """Check ``options`` against the keyword parameters of ``target`` (a class or function).

    Unknown names, missing required ones and values of the wrong annotated type raise
    :class:`ConfigError` naming ``key.name``.
    """
    # a class's own __init__ (its annotations are the keyword parameters' types; mypy calls reading
    # __init__ off a class unsound in general, since a subclass may change its signature)
    func = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
    sig = inspect.signature(func)
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # annotations that cannot be resolved are checked by the constructor
        hints = {}
    params = {n: p for n, p in sig.parameters.items()
              if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    out = {}
    for name, value in options.items():
        if name not in params:
            if accepts_any:
                out[name] = value
                continue
            raise ConfigError(f"{key}.{name}: unknown key (known: {', '.join(sorted(params)) or 'none'})")
        out[name] = _coerce(value, hints.get(name, Any), f"{key}.{name}")
    for name, p in params.items():
        if p.default is p.empty and name not in out:
            raise ConfigError(f"{key}.{name}: required")
    return out


# ---------------------------------------------------------------------------------------------
# loading


def apply_env(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Apply ``STREAM_VIPS__SECTION__KEY[__SUBKEY]=value`` overrides; values are parsed as YAML."""
    out = _deepcopy(data)
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split("__")]
        if not path or any(not p for p in path):
            raise ConfigError(f"{name}: malformed override name")
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(path)}: override {name} goes below a non-mapping value")
            node = child
        try:
            node[path[-1]] = yaml.safe_load(env[name])
        except Exception as exc:  # a YAMLError, or what a value's constructor raised
            dotted = ".".join(path)
            why = REDACTED if _secret_path(dotted) else _yaml_problem(exc, env[name])
            raise ConfigError(f"{dotted}: override {name} is not valid YAML: {why}") from None
    return out


def _deepcopy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deepcopy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deepcopy(v) for v in data]
    return data


def _connector(kind: str, data: Any) -> ConnectorConfig:
    """A connector section as its ``type`` and raw options (the service checks the options
    against the connector, :func:`stream_vips.service.build.check`)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{kind}: expected a mapping, got {data!r}")
    default = {"source": _default_source, "sink": _default_sink, "dead_letter": _default_dead_letter}[kind]()
    type_name = data.get("type", default.type)
    if not isinstance(type_name, str):
        raise ConfigError(f"{kind}.type: expected a connector name, got {type_name!r}")
    options = {k: v for k, v in data.items() if k != "type"}
    if "type" not in data:
        options = {**default.options, **options}
    return ConnectorConfig(type_name, options)


def _validate(cfg: Config) -> None:
    p, s, sch, rt = cfg.privacy, cfg.sampling, cfg.schedule, cfg.runtime
    checks = [
        ("privacy.epsilon", 0 < p.epsilon < math.inf and (p.noise_multiplier is not None or p.epsilon <= MAX_EPSILON),
         f"must be in (0, {MAX_EPSILON:g}] when the noise multiplier is calibrated from it: a larger budget bounds "
         "nothing (e^epsilon overflows above 709.78) and calibrating z toward it overflows the accountant (with a "
         "fixed privacy.noise_multiplier any finite budget only says when to halt)"),
        ("privacy.seed", p.seed is None or p.seed >= 0, "must be a non-negative integer or null"),
        ("privacy.delta", 0 < p.delta < 1, "must be in (0, 1)"),
        ("privacy.planned_steps", p.planned_steps >= 1, "must be >= 1"),
        ("privacy.calibration_rtol", MIN_CALIBRATION_RTOL <= p.calibration_rtol < 0.5,
         f"must be in [{MIN_CALIBRATION_RTOL:g}, 0.5) (below that floor z is finer than double precision)"),
        ("sampling.reservoir", s.reservoir >= 1, "must be >= 1"),
        ("sampling.batch_size", 1 <= s.batch_size <= s.reservoir, "must be in [1, sampling.reservoir]"),
        ("sampling.max_rejected_fraction", 0 <= s.max_rejected_fraction <= 1, "must be in [0, 1]"),
        ("sampling.window_rate", 0 < s.window_rate <= 1, "must be in (0, 1]"),
        ("schedule.rho_min", 0 <= sch.rho_min <= 1, "must be in [0, 1]"),
        ("privacy.accounting", p.accounting == "stream" or (
            s.reservoir_policy == "window" and s.window_rate == 1.0 and sch.every_records is not None
            and sch.every_seconds is None),
         "window accounting needs sampling.reservoir_policy: window with window_rate 1 and a pure "
         "schedule.every_records schedule (a record's steps must be bounded by positions)"),
        ("schedule.every_records", sch.every_records is None or sch.every_records >= 1, "must be >= 1 or null"),
        ("schedule.every_seconds", sch.every_seconds is None or sch.every_seconds > 0, "must be > 0 or null"),
        ("schedule", sch.every_records is not None or sch.every_seconds is not None,
         "set every_records and/or every_seconds"),
        ("schedule.tau0", sch.tau0 >= 1, "must be >= 1 so that rho_t = (tau0 + t)^-kappa <= 1"),
        ("schedule.kappa", 0.5 < sch.kappa <= 1, "must be in (0.5, 1] (Robbins-Monro)"),
        ("metrics.port", 0 <= cfg.metrics.port <= 65535, "must be in [0, 65535]"),
        ("runtime.blas_threads", rt.blas_threads is None or rt.blas_threads >= 1, "must be >= 1 or null"),
        ("runtime.poll_max_records", rt.poll_max_records >= 1, "must be >= 1"),
        ("runtime.poll_timeout_s", rt.poll_timeout_s >= 0, "must be >= 0"),
        ("runtime.checkpoint_interval_s", rt.checkpoint_interval_s >= 0, "must be >= 0"),
        ("runtime.publish_interval_s", rt.publish_interval_s >= 0, "must be >= 0"),
        ("runtime.source_check_s", rt.source_check_s > 0, "must be > 0"),
        ("runtime.decode_workers", rt.decode_workers in (0, 1), "must be 0 or 1"),
        ("runtime.decode_workers", s.validation == "all" or rt.decode_workers == 0,
         "must be 0 with sampling.validation: admitted (admitted records are decoded when the reservoir "
         "admits them, in the pipeline's process, not ahead in a worker)"),
        ("runtime.shards", rt.shards >= 1, "must be >= 1"),
        ("runtime.shards", rt.shards <= s.reservoir, "must be at most sampling.reservoir (every shard holds a slot)"),
        ("runtime.shard_timeout_s", rt.shard_timeout_s > 0, "must be > 0"),
        ("privacy.key_field", rt.shards == 1 or p.unit == "record" or p.key_field is None,
         "must be null with runtime.shards > 1: a person's records are in one shard only when the privacy key is "
         "the Kafka message key (the producer's partitioner puts one key in one partition); a field inside the "
         "record may put one person in two shards, which would count them twice in a step"),
        ("runtime.dead_letter_max_bytes", 0 < rt.dead_letter_max_bytes <= 900_000,
         "must be in [1, 900000] (below Kafka's default 1 MiB request limit)"),
    ]
    if p.mode == "private":
        z_ok = p.noise_multiplier is None or p.noise_multiplier >= MIN_NOISE_MULTIPLIER
        checks.append(("privacy.noise_multiplier", z_ok,
                       f"must be >= {MIN_NOISE_MULTIPLIER:g} or null (calibrated): below it the PLD accountant's loss "
                       "grid step, about 4 (20/z + 2/z^2) / 2^14, passes 709 and exp() overflows (one step at z = "
                       f"{MIN_NOISE_MULTIPLIER:g} already costs epsilon ~ 2e6); z = 0 needs privacy.mode: non_private"))
    else:
        checks.append(("privacy.noise_multiplier", p.noise_multiplier in (None, 0.0),
                       "must be null or 0 when privacy.mode is non_private"))
    if p.unit == "key":
        checks += [
            ("privacy.max_records_per_key", p.max_records_per_key >= 1, "must be >= 1"),
            ("privacy.key_field", p.key_field is None or p.key_field != "", "must be a field name or null"),
            ("privacy.unit", s.reservoir_policy == "uniform" and p.accounting == "stream",
             "key needs sampling.reservoir_policy: uniform and privacy.accounting: stream"),
            ("privacy.key_field", p.key_field is None or s.validation == "all",
             f"{p.key_field!r} must be decoded to find a record's key slot, so sampling.validation: admitted "
             "cannot decide admission before decoding; use the Kafka message key (key_field: null) or "
             "sampling.validation: all"),
        ]
    if p.block_weights is not None:
        checks.append(("privacy.block_weights", all(w > 0 for w in p.block_weights.values()), "weights must be > 0"))
    for key, ok, message in checks:
        if not ok:
            raise ConfigError(f"{key}: {message}")


def _check_ledger(ledger: LedgerConfig) -> None:
    if ledger.type == "file" and Path(ledger.path).is_dir():
        raise ConfigError(f"privacy.ledger.path: {ledger.path} is a directory; name the ledger file in it "
                          "(e.g. ledger.jsonl)")
    if ledger.prepay_steps is not None and (isinstance(ledger.prepay_steps, bool) or ledger.prepay_steps < 1):
        raise ConfigError(f"privacy.ledger.prepay_steps: must be >= 1 or null, got {ledger.prepay_steps!r}")
    if ledger.type != "kafka":
        if ledger.options:
            raise ConfigError(f"privacy.ledger.options: only a kafka ledger takes options, not {ledger.type!r}")
        return
    if not ledger.options.get("bootstrap_servers"):
        raise ConfigError("privacy.ledger.options.bootstrap_servers: required for a kafka ledger")
    if not (ledger.options.get("name") or ledger.options.get("ledger_id")):
        raise ConfigError("privacy.ledger.options.name: required for a kafka ledger: the spent budget is bound to "
                          "this name on the ledger topic, and a name taken from model.id would start a new budget "
                          "on the same data whenever the model is renamed")


def config_from_dict(data: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> Config:
    """Build and validate a :class:`Config` from the YAML layout, after env overrides."""
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(f"<root>: expected a mapping, got {type(data).__name__}")
    raw = apply_env(dict(data), os.environ if env is None else env)
    sections = {f.name for f in dataclasses.fields(Config)}
    for name in raw:
        if name not in sections:
            raise ConfigError(f"{name}: unknown section (known: {', '.join(sorted(sections))})")
    hints = typing.get_type_hints(Config)
    kwargs: dict[str, Any] = {}
    for name in sections & set(raw):
        if name in _CONNECTOR_SECTIONS:
            kwargs[name] = _connector(name, raw[name])
        else:
            kwargs[name] = _build_dataclass(hints[name], raw[name], name)
    cfg = Config(**kwargs)
    _check_ledger(cfg.privacy.ledger)
    _validate(cfg)
    return cfg


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read a YAML file (``None``: defaults only), apply env overrides and validate."""
    data: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"<file>: cannot read {path}: {exc}") from None
        try:
            data = yaml.safe_load(text) or {}
        except Exception as exc:  # a YAMLError, or what a value's constructor raised
            raise ConfigError(f"<file>: {path} is not valid YAML: {_yaml_problem(exc, text)}") from None
    return config_from_dict(data, env)
