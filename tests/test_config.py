"""Configuration: defaults that serve, env overrides, and a ConfigError naming the dotted key for
every unknown key or bad value, including connector options and model parameters."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
import yaml

from stream_vips.config import Config, ConfigError, ConnectorConfig
from stream_vips.models import model_class
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict, load_config


def test_empty_configuration_is_the_shipped_default_file():
    default_file = resources.files("stream_vips").joinpath("data", "default.yaml")
    with resources.as_file(default_file) as path:
        shipped = load_config(path, env={})
    assert shipped == config_from_dict({}, env={}) == load_config(None, env={})
    assert shipped.model.params == {"dim": 5, "dataset_size": 10_000}  # N defaults to M
    assert shipped.sampling.q == 0.1 and shipped.privacy.noise_multiplier is None


def _leaves(data: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping; an empty mapping is a leaf."""
    if isinstance(data, dict) and data:
        for name, value in data.items():
            yield from _leaves(value, f"{key}.{name}" if key else str(name))
    else:
        yield key, data


def _schema_defaults(cls: type, key: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, default) of every field of the configuration dataclass ``cls``, recursing into
    nested dataclasses. Connector sections are a ``type`` plus options flattened beside it, and
    ``model.params`` holds the default family's ``default_params``, as in the YAML layout."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{key}.{f.name}" if key else f.name
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if dotted == "model.params":
            default = dict(model_class(Config().model.family).default_params)
        if hints[f.name] is ConnectorConfig:
            yield from _leaves({"type": default.type, **default.options}, dotted)  # a connector
        elif dataclasses.is_dataclass(hints[f.name]):
            yield from _schema_defaults(hints[f.name], dotted)
        else:
            yield from _leaves(default, dotted)


def _same_default(shipped: Any, default: Any) -> bool:
    """Equal value and type (PyYAML reads ``1e-5`` as a string); an int may stand for a float."""
    types = {type(default), int} if type(default) is float else {type(default)}
    return shipped == default and type(shipped) in types


def test_default_yaml_lists_every_key_with_its_dataclass_default():
    """default.yaml claims to list every key with its default: compare it with the dataclasses."""
    text = resources.files("stream_vips").joinpath("data", "default.yaml").read_text(encoding="utf-8")
    shipped = dict(_leaves(yaml.safe_load(text)))
    schema = dict(_schema_defaults(Config))
    assert "runtime.decode_workers" in schema and "privacy.ledger.prepay_steps" in schema  # the walk recurses
    assert sorted(set(schema) - set(shipped)) == [], "keys missing from default.yaml"
    assert sorted(set(shipped) - set(schema)) == [], "keys in default.yaml that the schema does not have"
    wrong = {k: (shipped[k], schema[k]) for k in schema if not _same_default(shipped[k], schema[k])}
    assert wrong == {}, "default.yaml value (or type) differs from the dataclass default"


def test_round_trip_through_the_yaml_layout():
    cfg = config_from_dict({"source": {"type": "jsonl", "path": "in.jsonl", "follow": True},
                            "privacy": {"block_weights": {"xx": 1.0, "xy": 2.0}}}, env={})
    assert config_from_dict(cfg.to_dict(), env={}) == cfg
    assert cfg.source.options == {"path": "in.jsonl", "follow": True}


def test_env_overrides_reach_nested_keys_and_are_parsed_as_yaml():
    env = {
        "STREAM_VIPS__PRIVACY__EPSILON": "0.5",
        "STREAM_VIPS__PRIVACY__LEDGER__PATH": "/data/ledger.jsonl",
        "STREAM_VIPS__SAMPLING__METHOD": "fixed",
        "STREAM_VIPS__SOURCE__TYPE": "jsonl",
        "STREAM_VIPS__SOURCE__PATH": "records.jsonl",
        "STREAM_VIPS__SCHEDULE__EVERY_SECONDS": "2.5",
        "STREAM_VIPS__METRICS__ENABLED": "false",
        "UNRELATED": "x",
    }
    cfg = config_from_dict({"privacy": {"epsilon": 3.0}}, env=env)
    assert cfg.privacy.epsilon == 0.5  # env wins over the file
    assert cfg.privacy.ledger.path == "/data/ledger.jsonl"
    assert cfg.sampling.method == "fixed" and cfg.schedule.every_seconds == 2.5
    assert cfg.source.type == "jsonl" and cfg.source.options == {"path": "records.jsonl"}
    assert cfg.metrics.enabled is False


def test_yaml_1_1_exponent_strings_are_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("privacy:\n  delta: 1e-6\n  epsilon: 2\n")  # PyYAML reads 1e-6 as a string
    cfg = load_config(path, env={})
    assert cfg.privacy.delta == 1e-6 and cfg.privacy.epsilon == 2.0


@pytest.mark.parametrize(
    "data, key",
    [
        ({"privacy": {"epsilom": 1.0}}, "privacy.epsilom"),
        ({"privacy": {"ledger": {"kind": "file"}}}, "privacy.ledger.kind"),
        ({"sampler": {}}, "sampler"),
        ({"privacy": {"epsilon": -1.0}}, "privacy.epsilon"),
        ({"privacy": {"epsilon": "a lot"}}, "privacy.epsilon"),
        ({"privacy": {"delta": 1.5}}, "privacy.delta"),
        ({"privacy": {"accountant": "magic"}}, "privacy.accountant"),
        ({"privacy": {"noise_multiplier": 0.0}}, "privacy.noise_multiplier"),
        ({"privacy": {"mode": "non_private", "noise_multiplier": 1.0}, "sink": {"type": "memory"}},
         "privacy.noise_multiplier"),
        ({"privacy": {"planned_steps": 2.5}}, "privacy.planned_steps"),
        ({"privacy": {"seed": -1}}, "privacy.seed"),
        ({"privacy": {"epsilon": 1e300}}, "privacy.epsilon"),
        ({"privacy": {"epsilon": 1.01e4}}, "privacy.epsilon"),
        ({"privacy": {"epsilon": float("inf"), "noise_multiplier": 1.0}}, "privacy.epsilon"),
        ({"privacy": {"noise_multiplier": 1e-300}}, "privacy.noise_multiplier"),
        ({"privacy": {"noise_multiplier": 9e-4}}, "privacy.noise_multiplier"),
        ({"privacy": {"block_weights": {"xx": -1.0}}}, "privacy.block_weights"),
        ({"sampling": {"method": "shuffle"}}, "sampling.method"),
        ({"sampling": {"batch_size": 20_000}}, "sampling.batch_size"),
        ({"sampling": {"reservoir": True}}, "sampling.reservoir"),
        ({"schedule": {"kappa": 0.4}}, "schedule.kappa"),
        ({"schedule": {"tau0": 0.5}}, "schedule.tau0"),
        ({"schedule": {"every_records": None}}, "schedule"),
        ({"metrics": {"port": 70_000}}, "metrics.port"),
        ({"metrics": {"enabled": "yes please"}}, "metrics.enabled"),
        ({"runtime": {"on_halt": "explode"}}, "runtime.on_halt"),
        ({"runtime": {"blas_threads": 0}}, "runtime.blas_threads"),
        ({"source": {"type": "carrier-pigeon"}}, "source.type"),
        ({"source": {"type": "synthetic", "dimensions": 3}}, "source.dimensions"),
        ({"source": {"type": "synthetic", "count": "many"}}, "source.count"),
        ({"source": {"type": "jsonl"}}, "source.path"),
        ({"sink": {"type": "jsonl", "path": 3}}, "sink.path"),
        ({"dead_letter": {"type": "stderr", "colour": True}}, "dead_letter.colour"),
        ({"model": {"family": "nope"}}, "model.family"),
        ({"model": {"params": {"dimension": 3}}}, "model.params.dimension"),
        ({"model": {"params": {"dim": "three"}}}, "model.params.dim"),
        ([1, 2], "<root>"),
    ],
)
def test_bad_configuration_fails_naming_the_key(data, key):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, env={})
    assert str(info.value).startswith(key + ":") or str(info.value).startswith(key + "."), str(info.value)


def test_bad_env_override_names_the_key():
    with pytest.raises(ConfigError, match=r"^privacy\.epsilon:"):
        config_from_dict({}, env={"STREAM_VIPS__PRIVACY__EPSILON": "[1, 2]"})
    with pytest.raises(ConfigError, match=r"^bogus:"):
        config_from_dict({}, env={"STREAM_VIPS__BOGUS__KEY": "1"})


def test_file_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("privacy: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, env={})


def test_values_checked_only_when_parts_are_built_still_name_their_section(tmp_path):
    # A model parameter value the model rejects (a negative bound) fails at start, naming model.params.
    cfg = config_from_dict({"model": {"params": {"dim": 2, "x_bound": -1.0}},
                            "privacy": {"ledger": {"type": "memory"}}, "metrics": {"enabled": False}}, env={})
    with pytest.raises(ConfigError, match=r"^model\.params:"):
        Application.from_config(cfg)
    # An accountant that cannot bound the configured sampling (PLD has no fixed-size sampling).
    cfg = config_from_dict({"privacy": {"accountant": "pld", "ledger": {"type": "memory"}},
                            "sampling": {"method": "fixed"}, "metrics": {"enabled": False}}, env={})
    with pytest.raises(ConfigError, match=r"^privacy\.accountant:"):
        Application.from_config(cfg)


def test_dataclass_defaults_construct_without_validation_errors():
    # Config() is the in-code default; validating its YAML form changes nothing but N = M.
    assert config_from_dict(Config().to_dict(), env={}).sampling == Config().sampling


def test_kafka_ledger_options_are_checked_and_name_the_key():
    from stream_vips.config import ConfigError
    from stream_vips.service.build import config_from_dict

    with pytest.raises(ConfigError, match="privacy.ledger.options.bootstrap_servers"):
        config_from_dict({"privacy": {"ledger": {"type": "kafka"}}}, env={})
    with pytest.raises(ConfigError, match="privacy.ledger.options"):
        config_from_dict({"privacy": {"ledger": {"type": "kafka", "options": {
            "bootstrap_servers": "127.0.0.1:1", "topick": "x"}}}}, env={})
    with pytest.raises(ConfigError, match="privacy.ledger.options: only a kafka ledger"):
        config_from_dict({"privacy": {"ledger": {"type": "file", "options": {"topic": "x"}}}}, env={})
    with pytest.raises(ConfigError, match=r"^privacy\.ledger\.options\.name: required for a kafka ledger"):
        config_from_dict({"privacy": {"ledger": {"type": "kafka", "options": {
            "bootstrap_servers": "127.0.0.1:1", "topic": "ledger"}}}}, env={})  # renaming model.id must not reset
    cfg = config_from_dict({"privacy": {"ledger": {"type": "kafka", "options": {
        "bootstrap_servers": "127.0.0.1:1", "topic": "ledger", "name": "churn"}}}}, env={})
    assert cfg.privacy.ledger.options == {"bootstrap_servers": "127.0.0.1:1", "topic": "ledger", "name": "churn"}


def test_default_yaml_names_every_model_family():
    """The family comment in default.yaml is the list a user picks from: it names every registered family."""
    from importlib import resources

    from stream_vips.models import MODEL_FAMILIES

    text = resources.files("stream_vips").joinpath("data", "default.yaml").read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("family:"))
    listed = {name.strip() for name in line.split("#", 1)[1].split("|")}
    assert listed == set(MODEL_FAMILIES)


def test_privacy_bounds_are_where_the_accountant_arithmetic_stays_finite():
    """The largest epsilon and the smallest z that validation accepts keep the accountant finite:
    calibrating one full-batch step to MAX_EPSILON stays well above the z floor, and that step at
    MIN_NOISE_MULTIPLIER has a finite epsilon (below about 8.4e-4 the PLD grid step overflows
    expm1)."""
    import math

    from stream_vips.config import MAX_EPSILON, MIN_NOISE_MULTIPLIER
    from stream_vips.privacy.accountants import make_accountant
    from stream_vips.privacy.calibration import calibrate_noise_multiplier
    from stream_vips.privacy.events import SubsampledGaussianEvent

    cfg = config_from_dict({"privacy": {"epsilon": MAX_EPSILON, "seed": 0}}, env={})
    assert cfg.privacy.epsilon == MAX_EPSILON
    # a fixed noise multiplier calibrates nothing: any finite budget only says when to halt
    assert config_from_dict({"privacy": {"epsilon": 1e300, "noise_multiplier": 2.0}}, env={}).privacy.epsilon == 1e300
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        config_from_dict({"privacy": {"epsilon": float("inf"), "noise_multiplier": 2.0}}, env={})
    z = calibrate_noise_multiplier(MAX_EPSILON, 1e-5, 1.0, 1, "poisson")
    assert 10 * MIN_NOISE_MULTIPLIER < z < 1.0
    config_from_dict({"privacy": {"noise_multiplier": MIN_NOISE_MULTIPLIER}}, env={})
    step = SubsampledGaussianEvent(MIN_NOISE_MULTIPLIER, 1.0, "poisson")
    eps = make_accountant("pld", "poisson").epsilon([step], 1e-5)
    assert math.isfinite(eps) and eps > 1e5  # no privacy left to speak of, but arithmetic that holds
    with pytest.raises(OverflowError):  # why the floor is needed: a few times lower, the accountant overflows
        make_accountant("pld", "poisson").epsilon([SubsampledGaussianEvent(3e-4, 1.0, "poisson")], 1e-5)


def test_a_directory_as_ledger_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^privacy\.ledger\.path: .* is a directory"):
        config_from_dict({"privacy": {"ledger": {"path": str(tmp_path)}}}, env={})


class _Seekable:
    """An empty seekable source: enough for a checkpoint to be restored at start."""

    exhausted = True

    def poll(self, n: int, t: float) -> list:
        return []

    def positions(self) -> dict:
        return {}

    def seek(self, offsets: Any) -> None: ...

    def commit(self, positions: Any = None) -> None: ...

    def commit_now(self, positions: Any = None) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


def test_a_directory_as_checkpoint_path_is_a_config_error_naming_it(tmp_path):
    from connectors.memory import MemoryDeadLetterSink, MemorySink

    cfg = config_from_dict({"model": {"family": "linreg"}, "metrics": {"enabled": False},
                            "privacy": {"ledger": {"type": "memory"}},
                            "runtime": {"checkpoint_path": str(tmp_path)}}, env={})
    with pytest.raises(ConfigError, match=r"^runtime\.checkpoint_path: checkpoint .* cannot be read: Is a directory"):
        Application.from_config(cfg, source=_Seekable(), sink=MemorySink(), dead_letter=MemoryDeadLetterSink())


@pytest.mark.parametrize("host", ["no such host!", "192.0.2.1"])  # not resolvable; TEST-NET-1, not ours
def test_a_bad_metrics_host_names_metrics_host(host, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default sinks' files, were the start not refused first
    cfg = config_from_dict({"metrics": {"host": host, "port": 0},
                            "privacy": {"ledger": {"path": str(tmp_path / "l.jsonl")}}}, env={})
    with pytest.raises(ConfigError, match=r"^metrics\.host: cannot serve metrics on "):
        Application.from_config(cfg)
    assert sorted(tmp_path.iterdir()) == []  # refused before the ledger or any connector was created


@pytest.mark.parametrize("rtol", [1e-300, 1e-13])
def test_a_calibration_tolerance_below_the_floor_is_refused_at_config_check(rtol):
    """Below 1e-12 the calibration's bracket cannot narrow in double precision (it searched
    forever); the config check names the key before anything starts."""
    with pytest.raises(ConfigError, match=r"^privacy\.calibration_rtol: must be in \[1e-12, 0\.5\)"):
        config_from_dict({"privacy": {"epsilon": 1.0, "calibration_rtol": rtol}}, env={})
    assert config_from_dict({"privacy": {"epsilon": 1.0, "calibration_rtol": 1e-12}}, env={})
