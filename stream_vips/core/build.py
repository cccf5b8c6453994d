"""A configuration turned into the parts of a :class:`~stream_vips.core.learner.PrivateLearner`.

The wiring the learner needs, in the order it needs it: the family's parameters (defaults,
``dataset_size`` = M, each one checked against the family's constructor), the model, the
random number generators (one for the reservoir, one for the engine), the reservoir of the
configured policy, the sampler, the accountant and the calibrated noise multiplier, the ledger
(memory or file: a Kafka ledger is the service's to open) and the budget monitor, then the
engine. Every refusal is a :class:`~stream_vips.errors.ConfigError` naming its key, raised
before anything is spent.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_vips.config import Config, check_kwargs
from stream_vips.core.data.key_reservoir import KeyReservoir
from stream_vips.core.data.protocols import AnyReservoir
from stream_vips.core.data.reservoir import Layout, Reservoir
from stream_vips.core.data.sampling import Sampler, make_sampler
from stream_vips.core.data.window import WindowReservoir, window_steps
from stream_vips.core.engine import PrivateEngine, allocation_diameter
from stream_vips.errors import ConfigError
from stream_vips.models import model_class
from stream_vips.models.base import Model
from stream_vips.privacy.accountants import Accountant, make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.calibration import calibrate_noise_multiplier
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import FileLedger, Ledger, MemoryLedger
from stream_vips.privacy.mechanisms import make_rng
from stream_vips.schedule import Trigger


def family_class(family: str) -> type[Model]:
    """The :class:`Model` subclass registered for ``family`` (:func:`stream_vips.models.model_class`)."""
    cls = model_class(family)
    if not issubclass(cls, Model):
        raise TypeError(f"model family {family!r} is registered as {cls!r}, which is not a Model")
    return cls


#: The spawn key of a seeded run's model seed: apart from the generators spawned from the run's
#: seed (children 0-2), a restart's engine (2, steps) and the shards' (14, ...).
MODEL_SEED_KEY = (3,)


def model_seed(run_seed: int) -> int:
    """The family's public seed in a run seeded with ``run_seed``: a 32-bit draw of its own
    stream (:data:`MODEL_SEED_KEY`), so that it neither repeats nor predicts the noise draws."""
    return int(np.random.SeedSequence(run_seed, spawn_key=MODEL_SEED_KEY).generate_state(1)[0])


def model_params(cfg: Config) -> dict[str, Any]:
    """The family's constructor arguments: its defaults, ``dataset_size`` = the reservoir's
    capacity M where the family takes one (public), then the configured ones, each checked
    against the constructor (``model.params.<name>`` named on a refusal). In a seeded run, the
    family's ``seed_param`` left at ``None`` becomes :func:`model_seed` of ``privacy.seed`` (the
    family's public randomness is then reproducible too; it never reads a record)."""
    cls = family_class(cfg.model.family)
    for name in cfg.model.params:
        if name in cls.retired_params:
            raise ConfigError(f"model.params.{name}: the {cfg.model.family} family no longer takes {name}; "
                              f"{cls.retired_params[name]}")
    params = {**cls.default_params, **cfg.model.params}
    signature = inspect.signature(cls.__init__).parameters
    if "dataset_size" in signature:
        params.setdefault("dataset_size", cfg.sampling.reservoir)
    seed_name = cls.seed_param
    if cfg.privacy.seed is not None and seed_name is not None and seed_name in signature \
            and params.get(seed_name, signature[seed_name].default) is None:
        params[seed_name] = model_seed(cfg.privacy.seed)
    params = check_kwargs(cls, params, "model.params")
    if cfg.privacy.unit == "key" and not cls.supports_key_unit:
        raise ConfigError(f"privacy.unit: key is not supported by the {cfg.model.family} family: {cls.key_unit_note}")
    return params


def model(cfg: Config, params: Mapping[str, Any]) -> Model:
    """The family's model with ``params`` (a bad value: ``model.params``)."""
    try:
        return family_class(cfg.model.family)(**params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model.params: {exc}") from exc


def reservoir(cfg: Config, layout: Layout, rng: np.random.Generator) -> AnyReservoir:
    """The reservoir of ``sampling.reservoir_policy`` (or key slots, ``privacy.unit: key``)."""
    if cfg.privacy.unit == "key":  # privacy rule 12: key slots of at most max_records_per_key records
        return KeyReservoir(dict(layout), cfg.sampling.reservoir, cfg.privacy.max_records_per_key, rng)
    if cfg.sampling.reservoir_policy == "window":
        return WindowReservoir(dict(layout), cfg.sampling.reservoir, rng, rate=cfg.sampling.window_rate)
    return Reservoir(dict(layout), cfg.sampling.reservoir, rng)


def sampler(cfg: Config) -> Sampler:
    try:
        return make_sampler(cfg.sampling.method, cfg.sampling.batch_size, cfg.sampling.reservoir)
    except ValueError as exc:
        raise ConfigError(f"sampling: {exc}") from exc


def window(cfg: Config) -> int | None:
    """L, the steps a record can be in under window accounting (``None``: stream accounting)."""
    if cfg.privacy.accounting != "window":
        return None
    every = cfg.schedule.every_records
    if every is None:  # the configuration refuses this already; the check narrows the type
        raise ConfigError("privacy.accounting: window needs schedule.every_records")
    return window_steps(cfg.sampling.reservoir, every)


def diameter(cfg: Config, m: Model) -> float:
    """The model's replace-one diameter for the configured noise allocation and privacy unit."""
    try:
        if cfg.privacy.unit == "key" and not m.supports_key_unit:
            raise ConfigError(f"privacy.unit: key is not supported by the {m.family} family: {m.key_unit_note}")
        return allocation_diameter(m, cfg.privacy.block_weights, cfg.privacy.unit)
    except ValueError as exc:
        key = "privacy.block_weights" if "block_weights" in str(exc) else "model.family"
        raise ConfigError(f"{key}: {exc}") from exc


def accountant(cfg: Config, s: Sampler, q: float, d: float) -> Accountant:
    """The configured accountant, checked on this release's event."""
    try:
        acct = make_accountant(cfg.privacy.accountant, s.name)
        acct.check(SubsampledGaussianEvent(1.0, q, s.name, diameter=d))
    except ValueError as exc:
        raise ConfigError(f"privacy.accountant: {exc}") from exc
    return acct


def noise_multiplier(cfg: Config, acct: Accountant, s: Sampler, q: float, d: float, steps: int,
                     m: Model | None = None) -> float:
    """``privacy.noise_multiplier``, else the model's own (:meth:`Model.own_noise_multiplier`, asked
    always, so that the model can check a given z against it; a warning names the epsilon the
    accountant certifies for it over ``steps`` steps), else the one calibrated to spend epsilon in
    ``steps`` steps."""
    z = cfg.privacy.noise_multiplier
    own = None
    if m is not None:
        try:
            own = m.own_noise_multiplier(cfg.privacy.epsilon, cfg.privacy.delta, s.normaliser(cfg.sampling.reservoir),
                                         steps)
        except ValueError as exc:
            raise ConfigError(f"model.params: {exc}") from exc
    if z is not None:
        return float(z)
    if own is not None:
        _warn_own_noise(cfg, acct, s.name, q, d, steps, own)
        return float(own)
    try:
        return calibrate_noise_multiplier(cfg.privacy.epsilon, cfg.privacy.delta, q, steps, s.name, accountant=acct,
                                          diameter=d, rtol=cfg.privacy.calibration_rtol)
    except (ValueError, ArithmeticError) as exc:
        raise ConfigError(f"privacy.noise_multiplier: cannot calibrate: {exc}") from exc


def _warn_own_noise(cfg: Config, acct: Accountant, sampling: str, q: float, d: float, steps: int, z: float) -> None:
    """Tell the user what a family's own noise rule spends, as the accountant certifies it."""
    event = SubsampledGaussianEvent(z, q, sampling, diameter=d, count=steps)
    spent = acct.epsilon([event], cfg.privacy.delta)
    budget = cfg.privacy.epsilon
    warnings.warn(f"{cfg.model.family}: the family's own noise rule (model.params.noise) sets z = {z:.4g}; the "
                  f"{acct.name} accountant certifies epsilon {spent:.3g} of the budget {budget:g} for the {steps} "
                  "planned steps" + (" (the rest stays unspent; the default noise: accountant spends it)"
                                     if spent < budget else " (steps past the budget are refused)"),
                  UserWarning, stacklevel=3)


def ledger(cfg: Config) -> Ledger:
    """The configured ledger when the core can open it (``memory``, ``file``); a Kafka ledger is
    the service's to open (:func:`stream_vips.service.build.ledger`) and is passed in."""
    kind = cfg.privacy.ledger.type
    if kind == "memory":
        return MemoryLedger()
    if kind == "file":
        path = cfg.privacy.ledger.path
        try:
            from pathlib import Path

            Path(path).parent.mkdir(parents=True, exist_ok=True)
            return FileLedger(path)
        except OSError as exc:
            raise ConfigError(f"privacy.ledger.path: cannot open {path}: {exc.strerror or exc}") from exc
    raise ConfigError(f"privacy.ledger.type: a {kind} ledger is opened by the service "
                      "(stream_vips.service.build.ledger(config)) and passed to the learner as ledger=")


def monitor(cfg: Config, acct: Accountant, led: Ledger, window_steps_: int | None, unit: str) -> BudgetMonitor:
    """The budget monitor over ``led`` (prepaid steps need the fixed stride of an
    ``every_records``-only schedule)."""
    stride = cfg.schedule.every_records if cfg.schedule.every_seconds is None else None
    return BudgetMonitor(cfg.privacy.epsilon, cfg.privacy.delta, acct, led,
                         prepay=cfg.privacy.ledger.prepay(cfg.privacy.planned_steps), stride=stride,
                         window=window_steps_, unit=unit)


@dataclass
class Parts:
    """Everything a learner is made of, as :func:`parts` built it."""

    model: Model
    reservoir: AnyReservoir
    trigger: Trigger
    engine: PrivateEngine
    monitor: BudgetMonitor | None  # the engine's, as what it is (None: non-private)
    ledger: Ledger | None
    owns_ledger: bool
    window_steps: int | None


def parts(cfg: Config, given_ledger: Ledger | None = None) -> Parts:
    """The learner's parts from ``cfg`` (``given_ledger`` replaces the configured ledger; the
    caller keeps it). A ledger opened here is closed again when a later part is refused."""
    m = model(cfg, model_params(cfg))
    rng, seeded = make_rng(cfg.privacy.seed)
    reservoir_rng, engine_rng = rng.spawn(2)
    res = reservoir(cfg, m.row_layout(), reservoir_rng)
    steps_in_window = window(cfg)
    smp = sampler(cfg)
    trig = Trigger(cfg.schedule.every_records, cfg.schedule.every_seconds)
    non_private = cfg.privacy.mode == "non_private"
    d = diameter(cfg, m)
    mon, z, accountant_name, led, owns = None, 0.0, "none", None, False
    if not non_private:
        q = smp.rate(res.capacity)
        acct = accountant(cfg, smp, q, d)
        accountant_name = acct.name
        z = noise_multiplier(cfg, acct, smp, q, d, steps_in_window or cfg.privacy.planned_steps, m)
        led, owns = (given_ledger, False) if given_ledger is not None else (ledger(cfg), True)
        try:
            mon = monitor(cfg, acct, led, steps_in_window, cfg.privacy.unit)
        except BaseException:
            if owns:
                led.close()
            raise
        if seeded and mon.steps:
            # a seeded run restarted on a ledger draws fresh noise, never the noise of earlier steps
            engine_rng = np.random.default_rng(np.random.SeedSequence(cfg.privacy.seed, spawn_key=(2, mon.steps)))
    try:
        engine = PrivateEngine(m, res, smp, mon, z, engine_rng, cfg.schedule.tau0, cfg.schedule.kappa, accountant_name,
                               block_weights=cfg.privacy.block_weights, seeded=seeded, non_private=non_private,
                               delta=cfg.privacy.delta, rho_min=cfg.schedule.rho_min, unit=cfg.privacy.unit)
    except ValueError as exc:
        if owns and led is not None:
            led.close()
        raise ConfigError(f"privacy: {exc}") from exc
    return Parts(m, res, trig, engine, mon, led, owns, steps_in_window)
