"""``fit`` itself: check everything public first (nothing spent), then drive one
:class:`~stream_vips.core.learner.PrivateLearner` whose reservoir is the whole data set through
the planned steps, and report what was spent and why."""

from __future__ import annotations

import collections
import dataclasses
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from stream_vips import messages
from stream_vips.errors import FitError, LedgerRefused, NoModelError, SpentError, error_text
from stream_vips.fitting.data import check_json_objects, encode_records, resolve_dim
from stream_vips.fitting.rules import (
    CALIBRATION_RTOL,
    PYTHON_NAMES,
    Settings,
    _rule_settings,
    calibration_rtol,
    check_public,
    check_settings,
    overridden,
)
from stream_vips.models import model_class
from stream_vips.privacy.ledger import first_line_is_ledger
from stream_vips.records import DataSet

if TYPE_CHECKING:
    from stream_vips.core.learner import PrivateLearner
    from stream_vips.models.posterior import PublishedModel


@dataclass
class FitResult:
    """What :func:`fit` returns: the posterior (as a reader rebuilds it from the message), the
    final model message (schema model-message.v1), the report and the settings used."""

    posterior: PublishedModel
    message: dict[str, Any]
    report: dict[str, Any]
    settings: Settings


# -------------------------------------------------------------------------------------- pipeline


def _config(settings: Settings, model_params: Mapping[str, Any], *, non_private: bool, seed: int | None,
            ledger_path: str | None, model_id: str, rtol: float) -> dict[str, Any]:
    """The learner's configuration for one fit: the whole data set as the reservoir (M = N),
    Poisson sampling at the rule's q, a trigger that never fires (``every_records`` N + 1:
    :func:`execute` takes the steps itself once every record is in), a file ledger that pays
    step by step or one in memory."""
    privacy: dict[str, Any] = {
        "mode": "non_private" if non_private else "private",
        "epsilon": 1.0 if non_private else settings.epsilon,
        "delta": settings.delta, "planned_steps": settings.steps, "accountant": settings.accountant, "seed": seed,
        "calibration_rtol": rtol, "block_weights": settings.block_weights,
        "ledger": {"type": "file", "path": str(ledger_path), "prepay_steps": 1} if ledger_path else {"type": "memory"},
    }
    return {
        "model": {"family": settings.family, "id": model_id, "params": {**settings.model_params, **model_params}},
        "privacy": privacy,
        "sampling": {"method": "poisson", "reservoir": settings.n, "batch_size": settings.batch_size},
        "schedule": {"every_records": settings.n + 1, "tau0": settings.tau0, "kappa": settings.kappa},
    }


#: fit's own keywords, for the close match of a misspelt one passed as a model parameter.
FIT_KEYWORDS = ("dim", "non_private", "seed", "steps", "x_columns", "y_column", "ledger_path", "settings", "model_id")


def check_param_names(family: str, params: Mapping[str, Any], names: Mapping[str, str] = PYTHON_NAMES) -> None:
    """Refuse a model parameter the family does not have, before anything is spent: one line
    naming it, with the closest model parameter or fit keyword; a learner option (``batch_size``,
    ``reservoir``) is named as one, which fit's rule sets."""
    import inspect

    from stream_vips.config import close_match
    from stream_vips.core.learner import LEARNER_OPTIONS

    cls = model_class(family)
    known = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
    own = {"epsilon", "delta", "seed", "non_private"}  # fit's own keywords
    learner = sorted({n for group in LEARNER_OPTIONS.values() for n in group} - own)
    for key in params:
        if key in known:
            continue
        given = names["give"].format(key)
        if key in cls.retired_params and key not in learner:
            raise FitError(f"{given}: the {family} family no longer takes {key}; {cls.retired_params[key]}")
        if key in learner:
            raise FitError(f"{given}: {key} is a learner option, which fit sets by its rule (docs/fit.md); pass "
                           "settings= (fit_settings) to replace the rule")
        hint = close_match(key, {f"{family} model parameter": known, "fit keyword": FIT_KEYWORDS,
                                 "learner option": learner})
        raise FitError(f"{given}: {key} is not a {family} model parameter{hint}")


def check_ledger(path: str, names: Mapping[str, str] = PYTHON_NAMES) -> None:
    """Refuse a ledger path that is not a file ledger before anything is opened or spent: a
    directory, a special file, or an existing file whose first line is not a ledger line (the
    data file, a model message: opening it would even cut a last line without a newline as a
    torn write)."""
    flag, where = names["ledger"], Path(path)
    if where.is_dir():
        raise LedgerRefused(f"{flag} {path} is a directory; give a ledger file, e.g. {where / 'ledger.jsonl'}")
    if where.exists() and not where.is_file():
        raise LedgerRefused(f"{flag} {path} is not a regular file")
    if where.is_file():
        try:
            is_ledger = first_line_is_ledger(where)
        except OSError as exc:
            raise LedgerRefused(f"{flag} {path} cannot be read: {exc.strerror or exc}") from exc
        if is_ledger is False:
            raise LedgerRefused(f"{flag} {path} is not a privacy ledger (its first line is not a ledger "
                                "line); give a new path or an existing ledger")


def _learner(config: dict[str, Any], names: Mapping[str, str]) -> PrivateLearner:
    """The learner of one fit. Failures while building it (the ledger, the model's memory, a
    parameter) come before any step: they raise :class:`FitError` with nothing spent."""
    from stream_vips.config import config_from_dict
    from stream_vips.core.learner import PrivateLearner
    from stream_vips.privacy.ledger import LedgerCorrupt, LedgerLocked, LedgerMismatch

    ledger = config["privacy"]["ledger"]
    try:
        return PrivateLearner(config=config_from_dict(config, env={}))
    except (LedgerCorrupt, LedgerLocked, LedgerMismatch) as exc:
        raise LedgerRefused(f"{names['ledger']}: {exc}; nothing was spent") from None
    except OSError as exc:  # only the ledger file touches the file system here
        raise LedgerRefused(f"{names['ledger']} {ledger.get('path')}: {exc.strerror or exc}; "
                            "nothing was spent") from None
    except MemoryError:
        raise FitError(f"not enough memory for the {config['model']['family']} model at this dimension; "
                       "nothing was spent") from None
    except TypeError as exc:  # a model parameter of the wrong type
        raise FitError(f"{names['param']}: {exc}; nothing was spent") from None


@dataclass
class _Run:
    """What one fit's steps have made so far: the first model (kept as a message: if a later
    update fails half-way, it is the last whole one) and the counts of records."""

    accepted: int = 0
    rejected: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first: dict[str, Any] | None = None


def _run(learner: PrivateLearner, records: list[bytes] | list[dict[str, Any]], steps: int,
         run: _Run) -> dict[str, Any] | None:
    """Feed the whole data set (it fills the reservoir of M = N), then take the planned steps
    (fewer if the budget refuses one, which halts the learner); the final model's message."""
    batch = learner.feed(records)
    run.accepted, run.rejected = int(np.count_nonzero(batch.ok)), collections.Counter(learner.rejected)
    if learner.monitor is not None and not learner.halted:  # private
        learner.monitor.check_room(learner.engine.event())  # a spent ledger halts before any step
    while learner.steps_taken < steps and not learner.halted and learner.reservoir.full:
        if learner.step() is not None and run.first is None:
            run.first = learner.message(halted=False)
    return learner.message(halted=learner.halted)


def _failure(learner: PrivateLearner, run: _Run, exc: Exception, non_private: bool,
             paid_before: int | None) -> FitError:
    """The error for a fit whose steps raised: :class:`NoModelError` when the ledger holds no new
    step (nothing spent), else :class:`SpentError` with the newest model that is whole. That is
    the learner's model when the update of the last paid step completed (the ledger is appended
    before the update, so it is paid for); when that update itself failed, the model may mix two
    steps, so the first step's model is kept instead and the error says so. Building the message
    may fail again (it recomputes the spent epsilon): then the first step's too."""
    engine, monitor = learner.engine, learner.monitor
    if non_private or monitor is None:
        paid, spent = None, engine.last_step is not None
    else:  # a private fit counted the steps paid before it (execute)
        paid = monitor.steps
        spent = paid_before is not None and paid > paid_before
    if not spent:  # the ledger holds no new step: nothing was spent (an ordinary failure)
        return NoModelError(f"no model: the fit failed before any step was {'made' if non_private else 'paid'} "
                            f"({error_text(exc)}); nothing was spent")
    error, message = error_text(exc), None
    if paid is None or engine.last_step == paid - 1:
        try:
            message = learner.message()
        except Exception:  # noqa: BLE001 - the same failure again: fall back to the first model
            message = None
    if message is None and run.first is not None:
        message = run.first
        if not non_private:
            error += (f"; the model kept is version {message['version']}, the last whole one, while the ledger "
                      f"holds {paid} paid steps")
    return SpentError(error, message, non_private)


def _non_private_message(message: dict[str, Any]) -> dict[str, Any]:
    """The message of a non-private run with a report that claims nothing: ``"private": false``
    and null epsilon (the engine's own report carries infinity, which strict JSON refuses)."""
    p = message["privacy"]
    report = messages.privacy_report(
        epsilon_spent=math.inf, delta=p["delta"], epsilon_budget=math.inf, accountant="none",
        sampling=p["sampling"], q=p["q"], noise_multiplier=0.0, steps=p["steps"], halted=p["halted"],
        seeded=p["seeded"], adjacency=p["adjacency"], diameter=p.get("diameter", 2.0), private=False)
    return messages.validate_message({**message, "privacy": report})


# ------------------------------------------------------------------------------------------- fit


def fit(data: DataSet, family: str, epsilon: float = 1.0, delta: float = 1e-5, *, dim: int | None = None,
        non_private: bool = False, seed: int | None = None, steps: int | None = None,
        x_columns: Sequence[str] | None = None, y_column: str | None = None, ledger_path: str | None = None,
        settings: Settings | None = None, model_id: str = "fit", **model_params: object) -> FitResult:
    """Fit ``family`` to the finite data set ``data`` with (epsilon, delta)-DP, spending the budget.

    ``data``: a list or iterable of records (dicts as the family parses them, or JSON lines),
    numpy ``(X, y)``, or a pandas DataFrame (``x_columns``/``y_column``). N (the number of
    records, valid or not) and d are public: for records pass ``dim`` (the family's dimension
    parameter: ``dim``, or ``n_visible`` for sbn, which may be passed under its own name; lda's d
    is the size of its ``vocabulary``, which it needs); for arrays and DataFrames d is their
    number of columns. The settings come from
    :func:`fit_settings` (``steps`` overrides its step count, ``settings`` replaces the rule
    entirely: only pass settings chosen without looking at this data's accuracy).
    ``model_params`` go to the family (e.g. ``noise="gamma"``, ``x_bound``, ``y_bound`` for
    linreg); ``dataset_size`` defaults to N. ``seed`` fixes the noise (reported as
    ``seeded: true``: reproduction, no guarantee); ``ledger_path`` keeps the privacy ledger in a
    file. Raises :class:`~stream_vips.errors.FitError` (a ``ValueError``) for bad input,
    before anything is spent, and when no model comes out; :class:`SpentError` (a FitError) when
    it fails once a step was paid, with ``.message`` the model of the last paid step; warns
    (:class:`FitWarning`, also in ``report["warnings"]``) when more than 10% of the records were
    rejected, and when the family's benchmark found it learns little at this N, d and epsilon
    (``report["regime"]``: the family's ``regime_warning``, from public quantities only).
    ``report["movement"]`` says how far the released model moved from its public prior (the
    family's ``movement``: post-processing, no budget), or why that cannot be said.
    """
    result = _fit(data, family, epsilon, delta, dim=dim, non_private=non_private, seed=seed, steps=steps,
                  x_columns=x_columns, y_column=y_column, ledger_path=ledger_path, settings=settings,
                  model_id=model_id, model_params=model_params, names=PYTHON_NAMES)
    for line in result.report["warnings"]:
        warnings.warn(line, FitWarning, stacklevel=2)
    return result


class FitWarning(UserWarning):
    """A fit that produced a model but that the user should look at (``report["warnings"]``)."""


def _fit(data: Any, family: str, epsilon: float, delta: float, *, dim: int | None, non_private: bool,
         seed: int | None, steps: int | None, x_columns: Sequence[str] | None, y_column: str | None,
         ledger_path: str | None, settings: Settings | None, model_id: str, model_params: dict[str, Any],
         names: Mapping[str, str]) -> FitResult:
    """:func:`fit`, with errors naming the inputs as the caller spells them (``names``)."""
    return execute(prepare(data, family, epsilon, delta, dim=dim, non_private=non_private, seed=seed, steps=steps,
                             x_columns=x_columns, y_column=y_column, ledger_path=ledger_path, settings=settings,
                             model_id=model_id, model_params=model_params, names=names))


@dataclass
class _Plan:
    """A fit that passed every check: what :func:`execute` runs (nothing spent yet)."""

    encoded: list[bytes] | list[dict[str, Any]]
    settings: Settings
    config: dict[str, Any]
    rtol: float
    non_private: bool
    ledger_path: str | None
    names: Mapping[str, str]
    started: float


def prepare(data: DataSet, family: str, epsilon: float, delta: float, *, dim: int | None, non_private: bool,
             seed: int | None, steps: int | None, x_columns: Sequence[str] | None, y_column: str | None,
             ledger_path: str | None, settings: Settings | None, model_id: str, model_params: dict[str, Any],
             names: Mapping[str, str]) -> _Plan:
    """The refusal phase: every check on the input, before anything is spent (FitError)."""
    started = time.perf_counter()
    check_public(family, epsilon, delta, non_private, names)
    cls = model_class(family)
    encoded, shape_d = encode_records(data, x_columns=x_columns, y_column=y_column, field=cls.record_field)
    n = len(encoded)
    if n == 0:
        raise FitError("fit needs at least one record")
    if shape_d is None:  # records given one by one: encode_records made each a JSON line
        check_json_objects(cast("list[bytes]", encoded))
    d = resolve_dim(family, dim, model_params, shape_d, names)
    check_param_names(family, model_params, names)
    if ledger_path is not None:
        check_ledger(ledger_path, names)
    dim_param = cls.dim_param
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1):
        raise FitError(f"steps must be a positive integer, got {steps!r}")
    if settings is None:
        settings = cls.fit_with(_rule_settings(family, n, d, None if non_private else epsilon, delta, non_private),
                                model_params, steps)
    else:
        check_settings(settings, family, n, d, epsilon, delta, non_private)
    if steps is not None:
        settings = dataclasses.replace(settings, steps=int(steps), why={**settings.why, "steps": (
            f"set by {names['steps']} (steps = {steps}); the rule would give {settings.steps}")})
    settings = overridden(settings, {k: v for k, v in model_params.items() if k != dim_param}, names["param"])
    try:
        settings = cls.fit_complete(settings, model_params)
    except ValueError as exc:
        raise FitError(f"{names['param']}: {exc}") from None
    params = {"dataset_size": n, **model_params, **({dim_param: d} if cls.dimension_of is None else {})}
    if non_private:
        rtol = CALIBRATION_RTOL
    elif settings.epsilon is None:  # check_public refused this already; the check narrows the type
        raise FitError("epsilon: a private fit needs one")
    else:
        rtol = calibration_rtol(settings.epsilon, settings.delta)
    config = _config(settings, params, non_private=non_private, seed=seed, ledger_path=ledger_path,
                     model_id=model_id, rtol=rtol)
    return _Plan(encoded, settings, config, rtol, non_private, ledger_path, names, started)


def execute(plan: _Plan) -> FitResult:
    """The execution phase: build the learner, step it and build the result. Building may still
    refuse (nothing spent); a failure during the run with no new step in the ledger is a
    :class:`NoModelError` (nothing spent); anything that fails once a step was paid raises
    :class:`SpentError` carrying the model of the last paid step."""
    settings, n, family = plan.settings, len(plan.encoded), plan.settings.family
    learner = _learner(plan.config, plan.names)
    learner.log_refusals = False  # fit raises the refusal's reason itself: one line per event
    run = _Run()
    paid_before = None
    try:
        paid_before = None if plan.non_private or learner.monitor is None else learner.monitor.steps
        try:
            message = _run(learner, plan.encoded, settings.steps, run)
        except Exception as exc:
            raise _failure(learner, run, exc, plan.non_private, paid_before) from exc
        stats = FitStats(run.accepted, run.rejected, learner.steps_taken, learner.halted, learner.halt_reason)
    finally:
        learner.close()
    if stats.accepted == 0 or message is None:
        reason = stats.halt_reason or (f"none of the {n} records was valid for {family!r}" if stats.accepted == 0
                                       else "no step was released")
        if plan.ledger_path is not None and learner.halt_cause == "budget" and paid_before:
            reason += (f" (the ledger {plan.ledger_path} already holds {paid_before} earlier step(s): a new budget "
                       "needs a new ledger)")
        known = model_class(family).rejection_hints
        hints = "".join(f"; {known[r]}" for r, _ in stats.rejected.most_common(3) if r in known)
        raise NoModelError(f"no model: {reason} (N = {n}, {stats.accepted} valid, rejected: "
                           f"{dict(stats.rejected) or 'none'}){hints}")
    try:
        if not plan.non_private and stats.updates >= settings.steps and not message["privacy"]["halted"]:
            # the planned steps spend the budget (to the calibration tolerance) and no version follows:
            # readers (inspect, report, ModelReader) should see a finished model, not "updating"
            message = messages.validate_message({**message, "privacy": {**message["privacy"], "halted": True}})
        if (plan.non_private and messages.is_private(message) is not False
                and message["privacy"]["accountant"] == "none"):
            message = _non_private_message(message)
        from stream_vips.models.posterior import posterior_from_message

        posterior = posterior_from_message(message)
        report = _report(settings, message, stats, n, plan.non_private, plan.rtol, time.perf_counter() - plan.started)
        report["warnings"] = fit_warnings(family, n, stats, settings.steps)
        regime = None if plan.non_private or settings.epsilon is None else \
            model_class(family).regime_warning(n, settings.d, settings.epsilon)
        report["regime"] = regime
        if regime is not None:
            report["warnings"].insert(0, regime)
        report["movement"] = posterior.model.movement()
    except Exception as exc:  # the budget is spent: the message must not be lost with the error
        raise SpentError(error_text(exc), message, plan.non_private) from exc
    return FitResult(posterior=posterior, message=message, report=report, settings=settings)


@dataclass(frozen=True)
class FitStats:
    """The counts of one fit: valid records, rejections per reason, steps released, halt."""

    accepted: int
    rejected: collections.Counter
    updates: int
    halted: bool
    halt_reason: str | None


#: Warn when more than this fraction of the records is rejected (the budget is spent on the rest).
WARN_REJECTED_FRACTION = 0.1


def fit_warnings(family: str, n: int, stats: FitStats, planned_steps: int) -> list[str]:
    """One line per thing a user should not miss in a fit that did produce a model (``stats``:
    the run's): more than :data:`WARN_REJECTED_FRACTION` of the records rejected (the top
    reasons, and the likely fix: the family's ``rejection_hints``), or fewer steps than planned
    (the halt reason). What counts as valid is the family's."""
    out = []
    total = sum(stats.rejected.values())
    if total > WARN_REJECTED_FRACTION * n:
        from stream_vips.records import top_reasons

        known = model_class(family).rejection_hints
        hints = [known[reason] for reason, _ in stats.rejected.most_common(3) if reason in known]
        out.append(f"{total} of the {n} records ({total / n:.0%}) were rejected, and the whole budget was spent on "
                   f"the rest; top reasons: {top_reasons(stats.rejected)}" + "".join(f"; {hint}" for hint in hints))
    if stats.updates < planned_steps:
        out.append(f"{stats.updates} of the {planned_steps} planned steps ran: {stats.halt_reason or 'stopped'}")
    return out


def _report(settings: Settings, message: Mapping[str, Any], stats: FitStats, n: int, non_private: bool,
            rtol: float, seconds: float) -> dict[str, Any]:
    """Privacy report of the final message plus the budget's use and the settings with reasons."""
    p = message["privacy"]
    budget: dict[str, Any]  # a JSON object of the report
    if non_private:
        budget = {"private": False, "epsilon_budget": None, "epsilon_spent": None,
                  "note": "non-private baseline: no noise, no guarantee"}
    else:
        spent, total = float(p["epsilon_spent"]), float(p["epsilon_budget"])
        budget = {"private": True, "epsilon_budget": total, "epsilon_spent": spent, "fraction_spent": spent / total,
                  "delta": float(p["delta"]), "noise_multiplier": float(p["noise_multiplier"]),
                  "calibration_rtol": rtol,
                  "how": (f"z calibrated with calibrate_noise_multiplier ({p['accountant']}, "
                          f"Poisson q = {settings.q:g}, replace-one, {_diameter_text(p)}) so that "
                          f"{settings.steps} steps spend the whole budget")}
    return {
        "privacy": dict(p),
        "budget": budget,
        "records": n,
        "accepted": int(stats.accepted),
        "rejected": dict(stats.rejected),
        "steps_taken": int(stats.updates),
        "settings": settings.as_dict(),
        "why": dict(settings.why),
        "seconds": seconds,
    }


def _diameter_text(privacy: dict) -> str:
    """The model's proven diameter, and the one the accountant charges when that is larger (the
    ``pld`` accountant counts a replace-one step at 2 whatever the model proves)."""
    d = float(privacy["diameter"])
    if privacy["accountant"] == "pld" and privacy.get("adjacency", "replace_one") == "replace_one" and d < 2.0:
        return f"diameter {d:.4g}, accounted at 2"
    return f"diameter {d:.4g}"


def summary(result: FitResult) -> str:
    """A few lines for a human: N, the settings, z and the budget spent."""
    r, s = result.report, result.settings
    lines = [f"stream-vips fit: {s.family}, N = {r['records']} records ({r['accepted']} valid), d = {s.d}",
             f"  settings ({s.rule}): q = {s.q:g} (batch {s.batch_size}), {s.steps} step{'s' if s.steps != 1 else ''}, "
             f"rho_t = ({s.tau0:g} + t)^-{s.kappa:g}, block weights {s.block_weights}"]
    b = r["budget"]
    if b["private"]:
        lines.append(f"  z = {b['noise_multiplier']:.4g} ({r['privacy']['accountant']} accountant, "
                     f"{_diameter_text(r['privacy'])}); epsilon spent {b['epsilon_spent']:.6g} of "
                     f"{b['epsilon_budget']:g} ({100 * b['fraction_spent']:.2f}%), delta {b['delta']:g}")
    else:
        lines.append("  NON-PRIVATE baseline: no noise, no privacy guarantee (epsilon_spent: null)")
    if r["rejected"]:
        lines.append(f"  rejected records: {r['rejected']}")
    if "movement" in r:
        lines.append(f"  moved: {r['movement']['line']}")
    for key, why in r["why"].items():
        lines.append(f"  why {key}: {why}")
    return "\n".join(lines)
