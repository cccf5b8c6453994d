"""The settings rule of ``fit``: every setting from public quantities only (N, d, the family,
epsilon, delta), never from the data being fitted (derivation and evidence in docs/fit.md).

Each family states its own rule in its module (:meth:`stream_vips.models.base.Model.fit_rule`)
from the pieces in :mod:`stream_vips.models.fit_rule` (re-exported here); this module holds what
``fit`` adds around them: the checks of the public inputs, the rule's lookup by family and the
calibration tolerance."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from stream_vips.errors import FitError
from stream_vips.models.fit_rule import RULE_VERSION as RULE_VERSION
from stream_vips.models.fit_rule import WHY_Q as WHY_Q
from stream_vips.models.fit_rule import Settings as Settings
from stream_vips.models.fit_rule import accountant_for as accountant_for
from stream_vips.models.fit_rule import gaussian_mu as gaussian_mu
from stream_vips.models.fit_rule import settings_from_rule as settings_from_rule
from stream_vips.models.fit_rule import why_accountant as why_accountant

#: Relative tolerance of the noise calibration: epsilon spent is in [budget / (1 + rtol)^2, budget]
#: (the tolerance on z is :func:`calibration_rtol`, smaller where epsilon is steep in z).
CALIBRATION_RTOL = 1e-3
#: Largest dimension d that fit accepts, checked before anything is allocated (linreg and logistic
#: keep d x d statistics: 80 GB each at this d, so their practical limit is the memory).
MAX_DIM = 100_000
#: How the caller names each input of :func:`fit`: Python keywords, or the command's flags.
#: ``give`` is how a model parameter is passed, with ``{}`` for its name.
PYTHON_NAMES = {"dim": "dim=D", "epsilon": "epsilon", "ledger": "ledger_path", "param": "the caller",
                "steps": "the caller", "give": "{}=..."}
CLI_NAMES = {"dim": "--dim D", "epsilon": "--epsilon", "ledger": "--ledger", "param": "--param", "steps": "--steps",
             "give": "--param {}=..."}


def fit_families() -> tuple[str, ...]:
    """The registered families ``fit`` has a rule for (those whose ``engine_refusal`` is ``None``)."""
    from stream_vips.models.registry import MODEL_FAMILIES, model_class

    return tuple(f for f in MODEL_FAMILIES if model_class(f).engine_refusal is None)


def __getattr__(name: str) -> Any:
    """``FAMILIES`` (:func:`fit_families`) and ``RULES`` (family -> its rule), read from the
    registry when asked for, so that importing this module loads no family."""
    from stream_vips.models.registry import model_class

    if name == "FAMILIES":
        return fit_families()
    if name == "RULES":
        rules: dict[str, Callable[..., Settings]] = {f: model_class(f).fit_rule for f in fit_families()}
        return rules
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fit_settings(family: str, n: int, d: int, epsilon: float | None, delta: float, *,
                 non_private: bool = False) -> Settings:
    """The settings rule: public quantities in, :class:`Settings` out (docs/fit.md explains it).

    Each family's rule is its :meth:`~stream_vips.models.base.Model.fit_rule`, documented in its
    module and summarised in docs/families.md. Families that take q = 1 (each step uses the
    whole data set: for Gaussian noise much larger than the sensitivity, subsampling at rate q
    amplifies privacy by about q, which is exactly offset by the q times smaller batch it
    normalises by, docs/fit.md, "Why q = 1") are accounted by :func:`accountant_for`'s exact
    Gaussian RDP with the model's diameter; families that subsample by the ``pld`` accountant.

    >>> s = fit_settings("linreg", n=1000, d=5, epsilon=1.0, delta=1e-5)
    >>> s.steps, s.q, s.tau0, s.kappa, s.accountant
    (1, 1.0, 1.0, 1.0, 'autodp')
    """
    check_public(family, epsilon, delta, non_private)
    return _rule_settings(family, n, d, None if non_private else epsilon, delta, non_private)


def _rule_settings(family: str, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
    """:func:`fit_settings` once :func:`check_public` has passed (``epsilon`` is ``None`` exactly when
    ``non_private``)."""
    from stream_vips.models.registry import model_class

    if isinstance(n, bool) or int(n) != n or n < 1:
        raise FitError(f"n must be a positive integer, got {n!r}")
    if isinstance(d, bool) or int(d) != d or d < 1:
        raise FitError(f"d must be a positive integer, got {d!r}")
    return model_class(family).fit_rule(int(n), int(d), None if epsilon is None else float(epsilon), float(delta),
                                        non_private)


def calibration_rtol(epsilon: float, delta: float) -> float:
    """The relative tolerance on z that keeps the spent epsilon in [budget / (1 + R)^2, budget],
    R = :data:`CALIBRATION_RTOL`.

    The calibration returns z at most (1 + rtol) above the smallest private z, so the spent
    epsilon is at least budget / (1 + rtol)^k, with k = -d ln epsilon / d ln z the steepness of
    the accountant's curve. For a Gaussian mechanism (q = 1, T steps: mu-GDP with
    mu = sqrt(T) D / z) delta(epsilon, mu) = Phi(-epsilon/mu + mu/2) - e^epsilon
    Phi(-epsilon/mu - mu/2) has d delta / d mu = phi(epsilon/mu - mu/2) and d delta / d epsilon =
    -e^epsilon Phi(-epsilon/mu - mu/2), so at the mu where delta(epsilon, mu) = delta

        k = mu phi(epsilon/mu - mu/2) / (epsilon e^epsilon Phi(-epsilon/mu - mu/2)),

    which depends on (epsilon, delta) only: about 1.1 at epsilon 1, but close to 2 delta /
    epsilon once epsilon is below delta (21.6 at epsilon 1e-6, delta 1e-5, where a tolerance of
    R on z left 0.997 of the budget spent). As (1 + x)^k <= e^(x k), rtol = 2 ln(1 + R) / (1.25 k)
    keeps the range, with a quarter of margin for an accountant's curve that is not exactly the
    Gaussian's (autodp's k is within 1% of it at epsilon 1e-6 to 4). Never above R.

    e^epsilon overflows a float from epsilon 710, so delta is computed as Phi(..) -
    exp(epsilon + ln Phi(..)) and mu is solved for in ln mu. For large epsilon k does not fall
    below 1 but rises to 2 (1.81 at epsilon 800, delta 1e-5): at fixed delta, epsilon(mu) =
    mu^2/2 + mu Phi^-1(1 - delta) + o(mu), so d ln epsilon / d ln mu -> 2. Above
    :data:`_STEEPNESS_LIMIT_EPSILON` (mu near 1400, where k is between 1.95 and 2.002 for every
    delta in [1e-300, 0.9]) k = 2 is used: at most 0.1% below the true k, well inside the
    quarter margin.

    >>> calibration_rtol(1.0, 1e-5) == CALIBRATION_RTOL
    True
    >>> round(calibration_rtol(1e-6, 1e-5) / CALIBRATION_RTOL, 3)
    0.074
    >>> [round(calibration_rtol(e, 1e-5) / CALIBRATION_RTOL, 3) for e in (800.0, 1e300)]
    [0.883, 0.8]
    """
    from scipy.stats import norm

    if epsilon > _STEEPNESS_LIMIT_EPSILON:
        k = 2.0
    else:
        mu = gaussian_mu(epsilon, delta)
        a = epsilon / mu
        k = mu / epsilon * math.exp(norm.logpdf(a - mu / 2) - epsilon - norm.logcdf(-a - mu / 2))
    return min(CALIBRATION_RTOL, 2 * math.log1p(CALIBRATION_RTOL) / (1.25 * k))


#: Above this epsilon :func:`calibration_rtol` uses the steepness's large-epsilon limit k = 2.
_STEEPNESS_LIMIT_EPSILON = 1e6


def check_public(family: str, epsilon: float | None, delta: float, non_private: bool,
                 names: Mapping[str, str] | None = None) -> None:
    """The family has a rule, epsilon is finite and > 0 (unless non-private), delta is in (0, 1),
    and epsilon is not so small that its calibration tolerance (:func:`calibration_rtol`) is below
    what the calibration can resolve (:data:`~stream_vips.privacy.accountants.MIN_CALIBRATION_RTOL`)."""
    from stream_vips.models.registry import MODEL_FAMILIES, model_class

    if family not in MODEL_FAMILIES:
        raise FitError(f"fit has a settings rule for the families {list(fit_families())}, not {family!r}")
    refusal = model_class(family).engine_refusal
    if refusal is not None:
        raise FitError(f"fit refuses the {family} family: {refusal}")
    if not non_private and not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise FitError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise FitError(f"delta must be in (0, 1), got {delta!r}")
    if not non_private and epsilon is not None:  # a number here: refused above otherwise
        from stream_vips.privacy.calibration import MIN_CALIBRATION_RTOL

        rtol = calibration_rtol(epsilon, delta)
        if rtol < MIN_CALIBRATION_RTOL:
            # Where the tolerance is this small, epsilon is far below delta and calibration_rtol is
            # proportional to epsilon (k ~ 2 delta / epsilon), so the floor is reached at
            # epsilon * floor / rtol; 1% above that leaves room for the rounding in the message.
            smallest = epsilon * MIN_CALIBRATION_RTOL / rtol * 1.01
            raise FitError(f"{(names or PYTHON_NAMES)['epsilon']} {epsilon!r} is too small to calibrate the noise "
                           f"to (its tolerance would be finer than double precision); the smallest budget "
                           f"supported at delta {delta!r} is {smallest:.3g}")


def check_settings(settings: Settings, family: str, n: int, d: int, epsilon: float | None, delta: float,
                   non_private: bool) -> None:
    """Refuse ``settings`` made for another fit: their family, n, d, epsilon, delta or privacy
    would silently replace the call's (a budget of 0.1 spent as 4.0). One line names the field.

    >>> try:
    ...     check_settings(fit_settings("linreg", 500, 3, 4.0, 1e-5), "linreg", 500, 3, 0.1, 1e-6, False)
    ... except FitError as exc:
    ...     print(str(exc).split(";")[0])
    settings= are for epsilon = 4.0, but the call asks for epsilon = 0.1
    """
    if (settings.epsilon is None) != non_private:
        raise FitError(f"settings= are for a {'non-' if settings.epsilon is None else ''}private fit, but the call "
                       f"asks for a {'non-' if non_private else ''}private one; pass settings made for this call")
    call = {"family": family, "n": n, "d": d, "epsilon": None if non_private or epsilon is None else float(epsilon),
            "delta": float(delta)}
    for key, value in call.items():
        if getattr(settings, key) != value:
            raise FitError(f"settings= are for {key} = {getattr(settings, key)!r}, but the call asks for "
                           f"{key} = {value!r}; pass settings made for this call (fit_settings)")


def overridden(settings: Settings, params: Mapping[str, Any], by: str) -> Settings:
    """``settings`` whose reasons say which of the rule's choices ``params`` replace (the reason
    of a choice the rule did not make would be stale).

    >>> s = overridden(fit_settings("sep_bnn", 1000, 3, 1.0, 1e-5), {"clip": None}, "--param")
    >>> s.why["clip"]
    'set by --param (clip = null); the rule would give clip = 1.0'
    """
    why = dict(settings.why)
    for key, value in params.items():
        if key in settings.model_params:
            if settings.model_params[key] == value:  # asked for what the settings already hold
                continue
            rule = f"{key} = {json.dumps(settings.model_params[key], default=repr)}"
        elif key in why:
            rule = why[key]
        else:
            continue
        why[key] = f"set by {by} ({key} = {json.dumps(value, default=repr)}); the rule would give {rule}"
    return dataclasses.replace(settings, why=why)
