"""``fit``: private Bayesian inference on a finite data set, spending the whole budget.

A stream service keeps a bounded reservoir and waits for records that keep arriving; a finite
data set has all its records at once. Under replace-one adjacency the number of records N is
public (privacy rule 1 in docs/privacy.md), so the whole data set can be the reservoir
(M = N) and every setting can be chosen from public quantities only: N, the dimension d, the
family, epsilon and delta. :func:`fit_settings` is that rule (derived in docs/fit.md from
synthetic data; never from the accuracy of the data being fitted), :func:`fit` runs the
pipeline once over the data with those settings, calibrates the noise multiplier so that the
planned steps spend the whole budget (up to the calibration tolerance) and returns the final
model message, its posterior and a report of what was spent and why each setting was chosen.

``non_private=True`` is the baseline without noise: its message says ``"private": false`` and
carries ``epsilon_spent: null`` (no guarantee, and no made-up number).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = np.hstack([rng.uniform(-0.5, 0.5, (2000, 2)), np.full((2000, 1), 0.5)])
>>> y = (X @ np.array([3.0, -2.0, 0.2]) + 0.3 * rng.logistic(size=2000) > 0).astype(float)
>>> result = fit((X, y), "logistic", epsilon=1.0, delta=1e-5, seed=0)
>>> result.report["privacy"]["epsilon_spent"] <= 1.0 < result.report["privacy"]["epsilon_spent"] * 1.01
True
>>> result.settings.steps, result.settings.q
(2, 1.0)
>>> baseline = fit((X, y), "logistic", non_private=True, seed=0)
>>> baseline.message["privacy"]["private"], baseline.message["privacy"]["epsilon_spent"]
(False, None)
>>> p = result.posterior.model.predict_proba(np.array([[0.5, -0.5, 0.5]]))
>>> bool(p[0] > 0.9)
True

Command line: ``stream-vips fit --family logistic --dim 3 --epsilon 1 --delta 1e-5 --out
model.json data.jsonl`` (``--non-private`` for the baseline); see ``stream-vips fit --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from stream_vips import messages
from stream_vips.errors import FitError

#: Relative tolerance of the noise calibration: epsilon spent is in [budget / (1 + rtol)^2, budget]
#: (the tolerance on z is :func:`calibration_rtol`, smaller where epsilon is steep in z).
CALIBRATION_RTOL = 1e-3
#: Largest dimension d that fit accepts, checked before anything is allocated (linreg and logistic
#: keep d x d statistics: 80 GB each at this d, so their practical limit is the memory).
MAX_DIM = 100_000
#: Version of the settings rule (reported with every fit).
RULE_VERSION = "fit_settings/4"

#: Logistic rule constants, chosen on synthetic data and public tuning sets (not the evaluated ones) by
#: benchmarks/fit_rule_evidence.py (docs/fit.md).
LOGISTIC_STEPS = 2
LOGISTIC_KAPPA = 1.0
LOGISTIC_WEIGHTS = {"s1": 1.0, "s2": 1.5}
#: Eigenvalue floor of the averaged noisy s2, in units of sqrt(d) * its diagonal noise std: 1, a
#: little below the spectral edge sqrt(2) of the symmetric noise (stream_vips/models/logistic.py).
LOGISTIC_FLOOR_FACTOR = 1.0
#: The centred release of logistic regression (stream_vips/models/logistic.py), with the settings
#: of its best candidate in stage D of benchmarks/fit_rule_evidence.py.
CENTRED_LOGISTIC = {"steps": 32, "weights": {"g": 1.0, "s2": 1.0}, "residual_clip": 0.5, "step_size": 0.5,
                    "averaged_share": 0.75}
#: The rule takes the centred release when N >= this and d >= CENTRED_MIN_D: chosen on the tuning
#: sets and validated on 90 other public sets (benchmarks/fit_release_validation.py).
CENTRED_MIN_N = 1000
CENTRED_MIN_D = 6
#: Non-private logistic: enough damped fixed-point steps to converge (no noise to average).
NON_PRIVATE_LOGISTIC_STEPS = 30
NON_PRIVATE_KAPPA = 0.51


@dataclass(frozen=True)
class Settings:
    """Everything :func:`fit` configures, all from public quantities (N, d, family, epsilon, delta).

    ``q`` is the Poisson sampling rate over the whole data set (the reservoir), ``steps`` the
    number of private releases (the noise multiplier is calibrated so that they spend the whole
    budget), ``tau0``/``kappa`` the step sizes rho_t = (tau0 + t)^-kappa of the M-step blend,
    ``block_weights`` the noise allocation across released blocks (``None``: proportional to
    the bounds), ``model_params`` extra family parameters, ``accountant`` the privacy
    accountant that calibrates z and tracks the budget (:func:`accountant_for`), and ``why``
    one sentence per choice.
    """

    family: str
    n: int
    d: int
    epsilon: float | None
    delta: float
    q: float
    steps: int
    tau0: float
    kappa: float
    block_weights: dict[str, float] | None
    model_params: dict[str, Any] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    rule: str = RULE_VERSION
    accountant: str = "pld"

    @property
    def batch_size(self) -> int:
        """Expected batch size q * N (the configuration's ``sampling.batch_size``)."""
        return max(1, int(round(self.q * self.n)))

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["batch_size"] = self.batch_size
        return out


def logistic_rule_summary() -> dict[str, Any]:
    """The private logistic rule's s1 release (N < CENTRED_MIN_N or d < CENTRED_MIN_D), in the
    form benchmarks/fit_rule_evidence.py reports (its stages 0-C choose it)."""
    return {"q": 1.0, "steps": LOGISTIC_STEPS, "floor_factor": LOGISTIC_FLOOR_FACTOR,
            "s2_over_s1": LOGISTIC_WEIGHTS["s2"] / LOGISTIC_WEIGHTS["s1"], "kappa": LOGISTIC_KAPPA,
            "accountant": accountant_for(1.0), "release": "sums"}


def accountant_for(q: float) -> str:
    """The accountant for a fit whose every step samples at Poisson rate ``q``.

    At q = 1 every step is a plain Gaussian mechanism: the sum over all N records, whose
    replace-one L2 sensitivity is the model's proven diameter D (in units of the joint bound C,
    :func:`stream_vips.core.engine.allocation_diameter`), plus N(0, (z C)^2) noise. Its Renyi DP is
    exactly alpha D^2 / (2 z^2) at every order alpha, which the ``autodp`` accountant uses
    (sigma = z / D; T steps compose to alpha T D^2 / (2 z^2), i.e. mu-GDP with mu = sqrt(T) D / z,
    and its conversion to (epsilon, delta) is within 0.1% of that exact curve: tests/test_fit.py).
    The ``pld`` accountant accounts a replace-one step at diameter 2 whatever the model proves
    (its dominating pair is only known for 2; stream_vips/privacy/accountant.py), so for the
    logistic family (D = 1.44 with the rule's weights) it needs a 2 / D = 1.39 times larger z at
    the same budget. Subsampled steps (q < 1) keep ``pld``: autodp bounds Poisson sampling under
    add/remove only.

    >>> accountant_for(1.0), accountant_for(0.3)
    ('autodp', 'pld')
    """
    return "autodp" if q == 1.0 else "pld"


_WHY_Q = ("q = 1: the whole data set every step; subsampling's amplification (about q) is cancelled "
          "by its q times smaller normaliser when the noise is large, and it adds sampling noise")
_WHY_ACCOUNTANT = ("autodp: at q = 1 a step is a plain Gaussian mechanism, whose Renyi DP alpha D^2 / (2 z^2) "
                   "uses the model's proven diameter D (the pld accountant counts replace-one at diameter 2)")


def _linreg_rule(n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
    """One step with rho = 1: conjugate, the statistics do not depend on the posterior."""
    why = {"q": _WHY_Q,
           "steps": ("1 step, rho = 1: conjugate, the statistics do not depend on the posterior, so one "
                     "release with the whole budget is the exact posterior of the noisy statistics"),
           "block_weights": ("linreg default allocation: equal shares for xx and xy (equal influence on the "
                             "posterior mean), 1/(d + 1) of the budget for yy (noise precision only)"),
           "accountant": _WHY_ACCOUNTANT}
    return Settings("linreg", n, d, epsilon, delta, 1.0, 1, 1.0, 1.0, None, why=why, accountant=accountant_for(1.0))


def _logistic_rule(n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
    """The s1 release (:func:`_logistic_sums_rule`), or the centred release where N and d are large
    enough (:data:`CENTRED_MIN_N`, :data:`CENTRED_MIN_D`)."""
    settings = _logistic_sums_rule(n, d, epsilon, delta, non_private)
    if non_private:
        return settings
    if centred_by_size(n, d):
        return centred_logistic(settings)
    why = {**settings.why, "release": (f"s1 (the paper's): N < {CENTRED_MIN_N} or d < {CENTRED_MIN_D}, where the "
                                       "centred release lost to it on the tuning sets (docs/fit.md)")}
    return dataclasses.replace(settings, why=why)


def centred_by_size(n: int, d: int) -> bool:
    """Whether the rule takes the centred release for a private logistic fit of N records in d."""
    return n >= CENTRED_MIN_N and d >= CENTRED_MIN_D


_WHY_CENTRED_SIZE = (f"N >= {CENTRED_MIN_N} and d >= {CENTRED_MIN_D}: better than the s1 release there on the "
                     "tuning sets and on 90 other public sets, benchmarks/fit_release_validation.py")


def _logistic_sums_rule(n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
    """Few uniformly averaged steps, s2-heavy weights, noise-aware floor (benchmarks/fit_rule_evidence.py)."""
    why = {"q": _WHY_Q}
    if non_private:
        why["steps"] = (f"{NON_PRIVATE_LOGISTIC_STEPS} damped fixed-point steps (kappa {NON_PRIVATE_KAPPA}): "
                        "no noise to average, so steps serve convergence only")
        return Settings("logistic", n, d, None, delta, 1.0, NON_PRIVATE_LOGISTIC_STEPS, 1.0, NON_PRIVATE_KAPPA,
                        None, why=why)
    why["steps"] = (f"{LOGISTIC_STEPS} steps averaged uniformly (rho_t = 1/(t+1)): enough E-steps for the "
                    "Polya-Gamma weights to settle, few enough that each release keeps a large share of the "
                    "budget (benchmarks/fit_rule_evidence.py)")
    why["block_weights"] = (f"s2:s1 weights {LOGISTIC_WEIGHTS['s2']:g}:{LOGISTIC_WEIGHTS['s1']:g}: the noise on "
                            "s2 multiplies the whole mean, so s2 gets more than its bound-proportional share "
                            "(best on synthetic and public tuning data, benchmarks/fit_rule_evidence.py)")
    why["floor_factor"] = (f"eigenvalue floor of the averaged noisy s2 at {LOGISTIC_FLOOR_FACTOR:.4g} sqrt(d) times "
                           "its diagonal noise std (public), a little below the noise's spectral edge sqrt(2): "
                           "directions the noise swamps are not inverted (best of 1, sqrt(2), 2 on tuning data)")
    why["accountant"] = _WHY_ACCOUNTANT
    return Settings("logistic", n, d, epsilon, delta, 1.0, LOGISTIC_STEPS, 1.0, LOGISTIC_KAPPA,
                    dict(LOGISTIC_WEIGHTS), model_params={"floor_factor": LOGISTIC_FLOOR_FACTOR}, why=why,
                    accountant=accountant_for(1.0))


def centred_logistic(settings: Settings, steps: int | None = None,
                     params: Mapping[str, Any] | None = None, asked: bool = False) -> Settings:
    """The private logistic rule with the centred release (the rule's choice for N >= CENTRED_MIN_N
    and d >= CENTRED_MIN_D, or ``release="centred"``): more steps, the residual block g in place
    of s1, the mean averaged over the last iterates.
    ``steps`` (the caller's step count) and the caller's ``residual_clip``, ``step_size`` and
    ``average_from`` in ``params`` replace the defaults, and the reasons say what was used."""
    c = CENTRED_LOGISTIC
    T = c["steps"] if steps is None else int(steps)
    chosen = {"residual_clip": c["residual_clip"], "step_size": c["step_size"],
              "average_from": int(T * (1.0 - c["averaged_share"]))}
    chosen.update({k: v for k, v in (params or {}).items() if k in chosen})
    shown = {k: json.dumps(v, default=repr) for k, v in chosen.items()}  # the model checks the values
    why = {**settings.why,
           "release": (f"centred ({'asked for' if asked else _WHY_CENTRED_SIZE}): each step releases "
                       f"g = sum clip(y - 1/2 - E[omega] x^T m, +-{shown['residual_clip']}) x at the iterate m "
                       f"instead of s1 and moves m by a step of {shown['step_size']} preconditioned by the "
                       f"averaged s2; the mean is the average of the iterates after step {shown['average_from']}. "
                       "Defaults: the best centred candidate "
                       "on the tuning data (benchmarks/fit_rule_evidence.py, stage D; docs/fit.md)"),
           "steps": f"{c['steps']} steps: the preconditioned steps need a few dozen E-steps to settle",
           "block_weights": "g:s2 weights 1:1 (stage D of benchmarks/fit_rule_evidence.py)"}
    return dataclasses.replace(settings, steps=c["steps"], block_weights=dict(c["weights"]),
                               model_params={**settings.model_params, "release": "centred", **chosen}, why=why)


#: Per family, the record field whose length is d and the model parameter that takes d.
DIMENSION = {"sbn": ("y", "n_visible")}


def dimension(family: str) -> tuple[str, str]:
    """(record field, model parameter) of a family's dimension d; ``("x", "dim")`` by default."""
    return DIMENSION.get(family, ("x", "dim"))


def _model_rule(family: str, module: str) -> Any:
    """A family whose module states its own rule (``fit_rule(n, d, epsilon, delta) -> dict`` with
    q, steps, tau0, kappa, model_params and why, derived in that family's docs) as a Settings rule."""

    def rule(n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        import importlib

        r = importlib.import_module(module).fit_rule(n, d, None if non_private else epsilon, delta)
        q = float(r["q"])
        why = dict(r["why"])
        if not non_private:
            why["accountant"] = _WHY_ACCOUNTANT if q == 1.0 else ("pld: subsampled steps (q < 1), "
                                                                  "Poisson replace-one at diameter 2")
        return Settings(family, n, d, epsilon, delta, q, int(r["steps"]), float(r["tau0"]), float(r["kappa"]),
                        r.get("block_weights"), model_params={**r["model_params"], dimension(family)[1]: d}, why=why,
                        accountant=accountant_for(q))

    rule.__doc__ = f"The rule of {module}.fit_rule (documented there)."
    return rule


#: The settings rule of each family: (n, d, epsilon, delta, non_private) -> Settings.
RULES = {"linreg": _linreg_rule, "logistic": _logistic_rule,
         "sbn": _model_rule("sbn", "stream_vips.models.sbn"),
         "sep_bnn": _model_rule("sep_bnn", "stream_vips.models.sep.bnn")}
#: Families :func:`fit_settings` has a rule for.
FAMILIES = tuple(RULES)


def fit_settings(family: str, n: int, d: int, epsilon: float | None, delta: float, *,
                 non_private: bool = False) -> Settings:
    """The settings rule: public quantities in, :class:`Settings` out (docs/fit.md explains it).

    * Every family: Poisson rate q = 1, i.e. each step uses the whole data set. For Gaussian
      noise much larger than the sensitivity (every useful budget), subsampling at rate q
      amplifies privacy by about q, which is exactly offset by the q times smaller batch it
      normalises by, so it buys no accuracy and adds sampling noise (docs/fit.md, "Why q = 1").
      At q = 1 the budget is accounted by :func:`accountant_for` (exact Gaussian RDP with the
      model's diameter).
    * ``linreg`` (conjugate): one step with rho = 1. Its statistics do not depend on the
      current posterior, so T releases averaged are worth no more than one release with the
      whole budget; one step gives the exact posterior of the noisy statistics. The noise is
      allocated by :func:`stream_vips.models.linreg.default_block_weights`.
    * ``logistic`` (the E-step depends on the current posterior): ``LOGISTIC_STEPS`` steps,
      averaged uniformly (tau0 = 1, kappa = 1: rho_t = 1 / (t + 1)), allocation weights
      ``LOGISTIC_WEIGHTS`` and the eigenvalue floor of s2 near the spectral edge of its public
      noise (``LOGISTIC_FLOOR_FACTOR``); chosen on synthetic data and public tuning sets
      (benchmarks/fit_rule_evidence.py). Non-private: ``NON_PRIVATE_LOGISTIC_STEPS`` damped
      fixed-point steps (kappa = 0.51), no noise to average.
    * ``sbn`` and ``sep_bnn``: the family module's own ``fit_rule`` (derived in docs/sbn.md and
      docs/sep_bnn.md from synthetic data); they subsample (q < 1), so the budget is tracked by
      the ``pld`` accountant.

    >>> s = fit_settings("linreg", n=1000, d=5, epsilon=1.0, delta=1e-5)
    >>> s.steps, s.q, s.tau0, s.kappa, s.accountant
    (1, 1.0, 1.0, 1.0, 'autodp')
    """
    check_public(family, epsilon, delta, non_private)
    return _rule_settings(family, n, d, epsilon, delta, non_private)


def _rule_settings(family: str, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
    """:func:`fit_settings` once :func:`check_public` has passed."""
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise FitError(f"n must be a positive integer, got {n!r}")
    if isinstance(d, bool) or int(d) != d or d < 1:
        raise FitError(f"d must be a positive integer, got {d!r}")
    return RULES[family](int(n), int(d), None if non_private else float(epsilon), float(delta), non_private)


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
    from scipy.optimize import brentq
    from scipy.stats import norm

    if epsilon > _STEEPNESS_LIMIT_EPSILON:
        k = 2.0
    else:
        def gdp_delta(log_mu: float) -> float:
            mu = math.exp(log_mu)
            return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon + norm.logcdf(-epsilon / mu - mu / 2)))

        mu = math.exp(brentq(lambda t: gdp_delta(t) - delta, math.log(1e-12), math.log(1e4), xtol=1e-13, rtol=1e-13))
        a = epsilon / mu
        k = mu / epsilon * math.exp(norm.logpdf(a - mu / 2) - epsilon - norm.logcdf(-a - mu / 2))
    return min(CALIBRATION_RTOL, 2 * math.log1p(CALIBRATION_RTOL) / (1.25 * k))


#: Above this epsilon :func:`calibration_rtol` uses the steepness's large-epsilon limit k = 2.
_STEEPNESS_LIMIT_EPSILON = 1e6


def check_public(family: str, epsilon: float | None, delta: float, non_private: bool,
                 names: Mapping[str, str] | None = None) -> None:
    """The family has a rule, epsilon is finite and > 0 (unless non-private), delta is in (0, 1),
    and epsilon is not so small that its calibration tolerance (:func:`calibration_rtol`) is below
    what the calibration can resolve (:data:`~stream_vips.privacy.accountant.MIN_CALIBRATION_RTOL`)."""
    if family not in RULES:
        raise FitError(f"fit has a settings rule for the families {list(FAMILIES)}, not {family!r}")
    if not non_private and not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise FitError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise FitError(f"delta must be in (0, 1), got {delta!r}")
    if not non_private:
        from stream_vips.privacy.accountant import MIN_CALIBRATION_RTOL

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
    call = {"family": family, "n": n, "d": d, "epsilon": None if non_private else float(epsilon),
            "delta": float(delta)}
    for key, value in call.items():
        if getattr(settings, key) != value:
            raise FitError(f"settings= are for {key} = {getattr(settings, key)!r}, but the call asks for "
                           f"{key} = {value!r}; pass settings made for this call (fit_settings)")


class NoModelError(FitError):
    """The fit ran but released no model; the message says why (the learner's halt reason)."""


class LedgerRefused(FitError):
    """The ledger path is not a usable privacy ledger (a directory, another kind of file, corrupt,
    or locked by another process); raised before anything is spent."""


class SpentError(FitError):
    """The fit failed once a step was paid (during the run or after it). ``message`` is the model
    of the last paid step (``None`` when no model was made): its budget is spent, so keep it
    (``stream_vips.client.posterior_from_message`` reads it). ``headline`` is the one line saying
    what failed (without "budget" for a non-private fit, which spends none)."""

    def __init__(self, error: str, message: dict[str, Any] | None, non_private: bool = False) -> None:
        self.headline = (f"the non-private fit failed after it made a model ({error})" if non_private else
                         f"the fit failed after privacy budget was spent ({error})")
        kept = "the last model is kept" if message is not None else "no model had been made"
        super().__init__(f"{self.headline}; {kept} (.message)")
        self.error, self.message = error, message


def _error_text(exc: BaseException) -> str:
    """``exc`` as one line: its type and message."""
    return " ".join(f"{type(exc).__name__}: {exc}".splitlines())


@dataclass
class FitResult:
    """What :func:`fit` returns: the posterior (as a reader rebuilds it from the message), the
    final model message (schema model-message.v1), the report and the settings used."""

    posterior: Any
    message: dict[str, Any]
    report: dict[str, Any]
    settings: Settings


# ------------------------------------------------------------------------------------------ data


def _dumps(obj: Any) -> bytes:
    try:
        import orjson

        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except ImportError:  # pragma: no cover - orjson is a dependency, json is the fallback
        return json.dumps(obj, default=_numpy_to_list).encode()


def _numpy_to_list(obj: Any) -> Any:
    """``json.dumps``'s ``default``: numpy arrays and scalars as lists and numbers."""
    if isinstance(obj, (np.ndarray, np.generic)):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


#: The line a record that is not JSON becomes: invalid JSON, so the run rejects that record alone
#: (counted as invalid_json, like a malformed line of a file) and names none of its values.
UNENCODABLE_RECORD = b"<a record that is not JSON>"


def _encode_record(rec: Any) -> bytes:
    """One record dict as its JSON line. What orjson refuses (an integer beyond 64 bits, a
    non-string key, a lone surrogate) is written by ``json`` as the same record's text would be
    in a file; what is not JSON at all (a set, a cycle) becomes :data:`UNENCODABLE_RECORD`."""
    try:
        return _dumps(rec)
    except (TypeError, ValueError, OverflowError, RecursionError):
        try:
            return json.dumps(rec, default=_numpy_to_list).encode()
        except (TypeError, ValueError, OverflowError, RecursionError):
            return UNENCODABLE_RECORD


def encode_records(data: Any, *, x_columns: Sequence[str] | None = None, y_column: str | None = None,
                   field: str = "x") -> tuple[list[bytes], int | None]:
    """The data as JSON records (bytes), one per arrival, and d when the data's shape fixes it.

    ``data``: a list/iterable of dicts (or of bytes or str lines), numpy ``(X, y)`` or ``X``, or
    a pandas DataFrame (``y_column``, default ``"y"`` when present; ``x_columns``, default all
    the other columns; :func:`stream_vips.core.data.records.tabular`). A lone X (array, or a DataFrame
    without y) fills the record ``field``: the family's vector (``x``, or ``y`` for sbn's images).
    For arrays and DataFrames d is the number of columns of X, part of the schema (replacing one
    row cannot change it); records carry no such schema, so d is ``None`` and must be given
    (:func:`fit`'s ``dim``).

    >>> records, d = encode_records((np.zeros((2, 3)), np.ones(2)))
    >>> records[0], d
    (b'{"x":[0.0,0.0,0.0],"y":1.0}', 3)
    >>> encode_records([{"x": [1, 2]}])[1] is None
    True
    >>> encode_records(np.array([[0, 1, 1]]), field="y")[0]
    [b'{"y":[0.0,1.0,1.0]}']
    """
    from stream_vips.errors import DataError
    from stream_vips.core.data.records import tabular

    try:
        arrays = tabular(data, x_columns=x_columns, y_column=y_column)
    except DataError as exc:  # fit's errors are FitError (docs/fit.md); the message names no value
        raise FitError(str(exc)) from None
    if arrays is not None:
        X, y = arrays
        if y is None:
            return [_dumps({field: xi}) for xi in X], X.shape[1]
        return [_dumps({"x": xi, "y": yi}) for xi, yi in zip(X, y.tolist())], X.shape[1]
    try:
        records = iter(data)
    except TypeError:
        raise FitError(f"fit reads records (a list of dicts or JSON lines), (X, y) arrays, X or a DataFrame, not "
                       f"{type(data).__name__}") from None
    out = []
    for rec in records:
        if isinstance(rec, (bytes, bytearray)):
            out.append(bytes(rec))
        elif isinstance(rec, str):
            out.append(rec.encode("utf-8", "surrogatepass"))  # a lone surrogate: read as json reads it
        else:
            out.append(_encode_record(rec))
    return out, None


def check_json_objects(encoded: Sequence[bytes]) -> None:
    """Refuse data in which no record is a JSON object: a JSON array file, pretty-printed JSON
    or CSV read as JSON Lines. (A refusal on form alone: such data have no valid record, so no
    model could come out of them; nothing is spent.)"""
    for raw in encoded:
        if raw.lstrip()[:1] == b"{":
            try:
                if isinstance(json.loads(raw), dict):
                    return
            except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
                continue
    raise FitError("fit reads JSON Lines (one JSON object per line), and no record is a JSON object: a JSON "
                   "array, pretty-printed JSON or CSV must be converted first")


#: How the caller names each input of :func:`fit`: Python keywords, or the command's flags.
PYTHON_NAMES = {"dim": "dim=D", "epsilon": "epsilon", "ledger": "ledger_path", "param": "the caller",
                "steps": "the caller"}
CLI_NAMES = {"dim": "--dim D", "epsilon": "--epsilon", "ledger": "--ledger", "param": "--param", "steps": "--steps"}


def resolve_dim(family: str, dim: int | None, model_params: dict[str, Any], shape_d: int | None,
                names: Mapping[str, str] = PYTHON_NAMES) -> int:
    """The public dimension d: ``dim``, the family's dimension parameter in ``model_params``
    (``dim``, or ``n_visible`` for sbn, where ``dim`` is taken as ``n_visible`` and removed from
    ``model_params``) or the data's shape, which must agree; at most :data:`MAX_DIM`.

    Never read from a record: under replace-one adjacency a record's content must not decide
    the released dimension, nor which other records are valid (docs/fit.md, "What is private
    and what is public").

    >>> resolve_dim("sbn", None, {"dim": 10}, None), resolve_dim("logistic", None, {}, 3)
    (10, 3)
    """
    field_name, param = dimension(family)
    given = [dim, model_params.get(param)]
    if param != "dim":
        given.append(model_params.pop("dim", None))
    values = set()
    for value in given:
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer)) or not math.isfinite(value)
                or int(value) != value):
            raise FitError(f"the dimension ({names['dim']}) must be a positive integer, got {value!r}")
        values.add(int(value))
    if shape_d is not None and values and values != {shape_d}:
        raise FitError(f"the data have {shape_d} columns but the dimension is given as {sorted(values)[0]}")
    if shape_d is not None:
        values = {shape_d}
    if len(values) > 1:
        raise FitError(f"the dimension is given twice, as {' and '.join(map(str, sorted(values)))}")
    if not values:
        raise FitError(f"fit needs the dimension d of the records: pass {names['dim']} (the length of each "
                       f"record's {field_name!r}, the model parameter {param}); under replace-one adjacency d is "
                       "public, so it is never read from the data")
    (d,) = values
    if not 1 <= d <= MAX_DIM:
        raise FitError(f"the dimension must be between 1 and {MAX_DIM:,}, got {d:,}")
    return d


# -------------------------------------------------------------------------------------- pipeline


def _config(settings: Settings, model_params: Mapping[str, Any], *, non_private: bool, seed: int | None,
            ledger_path: str | None, model_id: str, rtol: float) -> dict[str, Any]:
    """Pipeline configuration for one fit: the whole data set as the reservoir, a step whenever
    the previous one is done (time trigger), exit when the planned steps are done or the budget
    refuses one, no metrics server."""
    privacy: dict[str, Any] = {
        "mode": "non_private" if non_private else "private",
        "epsilon": 1.0 if non_private else settings.epsilon,
        "delta": settings.delta, "planned_steps": settings.steps, "accountant": settings.accountant, "seed": seed,
        "calibration_rtol": rtol, "block_weights": settings.block_weights,
        "ledger": {"type": "file", "path": str(ledger_path), "prepay_steps": 1, "pay_ahead": False} if ledger_path
                   else {"type": "memory"},
    }
    return {
        "model": {"family": settings.family, "id": model_id, "params": {**settings.model_params, **model_params}},
        "privacy": privacy,
        "sampling": {"method": "poisson", "reservoir": settings.n, "batch_size": settings.batch_size},
        "schedule": {"every_records": None, "every_seconds": 1e-9, "tau0": settings.tau0, "kappa": settings.kappa},
        "source": {"type": "memory"}, "sink": {"type": "memory"}, "dead_letter": {"type": "memory"},
        "metrics": {"enabled": False},
        "runtime": {"poll_max_records": 10_000, "poll_timeout_s": 0.0, "on_halt": "exit",
                    "publish_interval_s": 1e9, "blas_threads": None},
    }


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


def read_first_line(path: Path) -> bytes:
    """The file's first line with its newline, if it has one (OSError if unreadable): the probe of
    ``--ledger`` (must be a ledger) and ``--out`` (must not be one)."""
    with open(path, "rb") as fh:
        return fh.readline()


def first_line_is_ledger(path: Path) -> bool | None:
    """Whether the file's first line is a privacy-ledger line, or a torn genesis that opening the
    ledger cuts (``None``: the file is empty). OSError if unreadable."""
    from stream_vips.privacy.ledger import LedgerCorrupt, is_torn_write, replay_lines

    first = read_first_line(path)
    if not first:
        return None
    if not first.endswith(b"\n"):
        return is_torn_write(first, first=True)
    try:
        replay_lines([first.rstrip(b"\n")], f"ledger {path}")
    except LedgerCorrupt:
        return False
    return True


def _run_pipeline(config: dict[str, Any], encoded: list[bytes], steps: int,
                  names: Mapping[str, str]) -> tuple[dict | None, Any]:
    """The only place that touches the pipeline: run ``config`` over ``encoded`` until ``steps``
    releases (or a budget halt); returns the last published message and the run's statistics.
    Failures while building (the ledger, the model's memory) happen before any step: they raise
    :class:`FitError` with nothing spent."""
    from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
    from stream_vips.config import config_from_dict
    from stream_vips.service.app import Application
    from stream_vips.privacy.ledger import LedgerCorrupt, LedgerLocked, LedgerMismatch

    sink = MemorySink()

    def stop_after_planned_steps(app: Any) -> None:
        if app.stats.updates >= steps:
            app.stop()

    ledger = config["privacy"]["ledger"]
    try:  # building: nothing is spent before the first step
        app = Application.from_config(
            config_from_dict(config, env={}), source=MemorySource(encoded, finite=False), sink=sink,
            dead_letter=MemoryDeadLetterSink(), progress=stop_after_planned_steps,
            **({"ledger": _memory_ledger()} if ledger["type"] == "memory" else {}))
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
    non_private = config["privacy"]["mode"] == "non_private"
    paid_before = None if non_private else len(app.ledger.events())
    try:
        stats = app.run()
    except Exception as exc:
        raise _failure_during_run(app, sink, exc, non_private, paid_before) from exc
    return (sink.messages[-1][1] if sink.messages else None), stats


def _failure_during_run(app: Any, sink: Any, exc: Exception, non_private: bool,
                        paid_before: int | None) -> FitError:
    """The error for a run that raised: :class:`NoModelError` when the ledger holds no new step
    (nothing spent), else :class:`SpentError` with the newest model that is whole. That is the
    learner's model when the update of the last paid step completed (the ledger is appended
    before the update, so it is paid for); when that update itself failed, the model may mix two
    steps, so the sink's last published version is kept instead and the error says so. Building
    the message may fail again (it recomputes the spent epsilon): then the sink's version too."""
    engine = app.learner.engine
    paid = None if non_private else len(app.ledger.events())
    spent = engine.last_step is not None if non_private else paid > paid_before
    if not spent:  # the ledger holds no new step: nothing was spent (an ordinary failure)
        return NoModelError(f"no model: the fit failed before any step was {'made' if non_private else 'paid'} "
                            f"({_error_text(exc)}); nothing was spent")
    error, message = _error_text(exc), None
    if non_private or engine.last_step == paid - 1:
        try:
            message = app.learner.message()
        except Exception:  # noqa: BLE001 - the same failure again: fall back to the published version
            message = None
    if message is None and sink.messages:
        message = sink.messages[-1][1]
        if not non_private:
            error += (f"; the model kept is version {message['version']}, the last whole one, while the ledger "
                      f"holds {paid} paid steps")
    return SpentError(error, message, non_private)


def _memory_ledger() -> Any:
    from stream_vips.privacy.ledger import MemoryLedger

    return MemoryLedger()


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


def fit(data: Any, family: str, epsilon: float = 1.0, delta: float = 1e-5, *, dim: int | None = None,
        non_private: bool = False, seed: int | None = None, steps: int | None = None,
        x_columns: Sequence[str] | None = None, y_column: str | None = None, ledger_path: str | None = None,
        settings: Settings | None = None, model_id: str = "fit", **model_params: Any) -> FitResult:
    """Fit ``family`` to the finite data set ``data`` with (epsilon, delta)-DP, spending the budget.

    ``data``: a list or iterable of records (dicts as the family parses them, or JSON lines),
    numpy ``(X, y)``, or a pandas DataFrame (``x_columns``/``y_column``). N (the number of
    records, valid or not) and d are public: for records pass ``dim`` (the family's dimension
    parameter: ``dim``, or ``n_visible`` for sbn, which may be passed under its own name); for
    arrays and DataFrames d is their number of columns. The settings come from
    :func:`fit_settings` (``steps`` overrides its step count, ``settings`` replaces the rule
    entirely: only pass settings chosen without looking at this data's accuracy).
    ``model_params`` go to the family (e.g. ``noise="gamma"``, ``x_bound``, ``y_bound`` for
    linreg); ``dataset_size`` defaults to N. ``seed`` fixes the noise (reported as
    ``seeded: true``: reproduction, no guarantee); ``ledger_path`` keeps the privacy ledger in a
    file. Raises :class:`~stream_vips.errors.FitError` (a ``ValueError``) for bad input,
    before anything is spent, and when no model comes out; :class:`SpentError` (a FitError) when
    it fails once a step was paid, with ``.message`` the model of the last paid step; warns
    (:class:`FitWarning`, also in ``report["warnings"]``) when more than 10% of the records were
    rejected.
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
    return _execute(_prepare(data, family, epsilon, delta, dim=dim, non_private=non_private, seed=seed, steps=steps,
                             x_columns=x_columns, y_column=y_column, ledger_path=ledger_path, settings=settings,
                             model_id=model_id, model_params=model_params, names=names))


@dataclass
class _Plan:
    """A fit that passed every check: what :func:`_execute` runs (nothing spent yet)."""

    encoded: list[bytes]
    settings: Settings
    config: dict[str, Any]
    rtol: float
    non_private: bool
    ledger_path: str | None
    names: Mapping[str, str]
    started: float


def _prepare(data: Any, family: str, epsilon: float, delta: float, *, dim: int | None, non_private: bool,
             seed: int | None, steps: int | None, x_columns: Sequence[str] | None, y_column: str | None,
             ledger_path: str | None, settings: Settings | None, model_id: str, model_params: dict[str, Any],
             names: Mapping[str, str]) -> _Plan:
    """The refusal phase: every check on the input, before anything is spent (FitError)."""
    started = time.perf_counter()
    check_public(family, epsilon, delta, non_private, names)
    encoded, shape_d = encode_records(data, x_columns=x_columns, y_column=y_column, field=dimension(family)[0])
    n = len(encoded)
    if n == 0:
        raise FitError("fit needs at least one record")
    if shape_d is None:
        check_json_objects(encoded)
    d = resolve_dim(family, dim, model_params, shape_d, names)
    if ledger_path is not None:
        check_ledger(ledger_path, names)
    dim_param = dimension(family)[1]
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1):
        raise FitError(f"steps must be a positive integer, got {steps!r}")
    if settings is None:
        settings = _rule_settings(family, n, d, None if non_private else epsilon, delta, non_private)
        if family == "logistic" and not non_private:
            asked = model_params.get("release")
            if asked == "centred" or (asked is None and settings.model_params.get("release") == "centred"):
                settings = centred_logistic(_logistic_sums_rule(n, d, epsilon, delta, False), steps, model_params,
                                            asked=asked == "centred")
            elif asked is not None:
                settings = _logistic_sums_rule(n, d, epsilon, delta, False)
    else:
        check_settings(settings, family, n, d, epsilon, delta, non_private)
    if steps is not None:
        settings = dataclasses.replace(settings, steps=int(steps), why={**settings.why, "steps": (
            f"set by {names['steps']} (steps = {steps}); the rule would give {settings.steps}")})
    settings = overridden(settings, {k: v for k, v in model_params.items() if k != dim_param}, names["param"])
    merged = {**settings.model_params, **model_params}
    average_from = merged.get("average_from", 0)
    if (merged.get("release") == "centred" and isinstance(average_from, int)
            and not isinstance(average_from, bool) and average_from >= settings.steps):
        raise FitError(f"average_from = {average_from} is not below the {settings.steps} steps, so no iterate "
                       f"would be averaged into the published mean (set a smaller one with {names['param']})")
    if family == "linreg" and settings.block_weights is None and not non_private:
        from stream_vips.models.linreg import default_block_weights

        gamma = model_params.get("noise", "known") == "gamma"
        try:  # checks x_bound and y_bound, which the model's own checks only see later
            weights = default_block_weights(d, model_params.get("x_bound", 1.0), model_params.get("y_bound", 1.0),
                                            gamma=gamma)
        except ValueError as exc:
            raise FitError(f"{names['param']}: {exc}") from None
        settings = dataclasses.replace(settings, block_weights=weights)
    params = {"dataset_size": n, **model_params, dim_param: d}
    rtol = CALIBRATION_RTOL if non_private else calibration_rtol(settings.epsilon, settings.delta)
    config = _config(settings, params, non_private=non_private, seed=seed, ledger_path=ledger_path,
                     model_id=model_id, rtol=rtol)
    return _Plan(encoded, settings, config, rtol, non_private, ledger_path, names, started)


def _execute(plan: _Plan) -> FitResult:
    """The execution phase: run the pipeline and build the result. Building the pipeline may still
    refuse (nothing spent); a failure during the run with no new step in the ledger is a
    :class:`NoModelError` (nothing spent); anything that fails once a step was paid raises
    :class:`SpentError` carrying the model of the last paid step."""
    settings, n, family = plan.settings, len(plan.encoded), plan.settings.family
    message, stats = _run_pipeline(plan.config, plan.encoded, settings.steps, plan.names)
    if stats.accepted == 0 or message is None:
        reason = stats.halt_reason or (f"none of the {n} records was valid for {family!r}" if stats.accepted == 0
                                       else "no step was released")
        if plan.ledger_path is not None and stats.halted and stats.accepted > 0:
            reason += f" (the ledger {plan.ledger_path} already holds earlier steps: a new budget needs a new ledger)"
        raise NoModelError(f"no model: {reason} (N = {n}, {stats.accepted} valid, rejected: "
                           f"{dict(stats.rejected) or 'none'})")
    try:
        if not plan.non_private and stats.updates >= settings.steps and not message["privacy"]["halted"]:
            # the planned steps spend the budget (to the calibration tolerance) and no version follows:
            # readers (inspect, report, ModelReader) should see a finished model, not "updating"
            message = messages.validate_message({**message, "privacy": {**message["privacy"], "halted": True}})
        if (plan.non_private and messages.is_private(message) is not False
                and message["privacy"]["accountant"] == "none"):
            message = _non_private_message(message)
        from stream_vips.client import posterior_from_message

        posterior = posterior_from_message(message)
        report = _report(settings, message, stats, n, plan.non_private, plan.rtol, time.perf_counter() - plan.started)
        report["warnings"] = fit_warnings(family, n, stats, settings.steps)
    except Exception as exc:  # the budget is spent: the message must not be lost with the error
        raise SpentError(_error_text(exc), message, plan.non_private) from exc
    return FitResult(posterior=posterior, message=message, report=report, settings=settings)


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


#: Warn when more than this fraction of the records is rejected (the budget is spent on the rest).
WARN_REJECTED_FRACTION = 0.1
#: Per family and rejection reason, what the user most likely got wrong.
REJECTION_HINTS = {("logistic", "out_of_range"): "logistic labels must be 0 or 1 (a -1/+1 label is out of range)"}


def fit_warnings(family: str, n: int, stats: Any, planned_steps: int) -> list[str]:
    """One line per thing a user should not miss in a fit that did produce a model (``stats``:
    the run's): more than :data:`WARN_REJECTED_FRACTION` of the records rejected (the top
    reasons, and the likely fix), or fewer steps than planned (the halt reason). What counts as
    valid is the family's."""
    out = []
    total = sum(stats.rejected.values())
    if total > WARN_REJECTED_FRACTION * n:
        from stream_vips.core.data.records import top_reasons

        hints = [REJECTION_HINTS[family, reason] for reason, _ in stats.rejected.most_common(3)
                 if (family, reason) in REJECTION_HINTS]
        out.append(f"{total} of the {n} records ({total / n:.0%}) were rejected, and the whole budget was spent on "
                   f"the rest; top reasons: {top_reasons(stats.rejected)}" + "".join(f"; {hint}" for hint in hints))
    if stats.updates < planned_steps:
        out.append(f"{stats.updates} of the {planned_steps} planned steps ran: {stats.halt_reason or 'stopped'}")
    return out


def _report(settings: Settings, message: Mapping[str, Any], stats: Any, n: int, non_private: bool,
            rtol: float, seconds: float) -> dict[str, Any]:
    """Privacy report of the final message plus the budget's use and the settings with reasons."""
    p = message["privacy"]
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


# ------------------------------------------------------------------------------------------- CLI


def _param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except (ValueError, RecursionError):  # not JSON (or nested too deeply for it): the text itself
        return key, value


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``fit`` subcommand."""
    p = subparsers.add_parser(
        "fit", help="fit a model to a finite JSONL data set, spending the whole privacy budget",
        description="Fit a model privately to a finite data set (one JSON record per line). The whole data "
                    "set is the reservoir; settings come from N, d, the family, epsilon and delta only "
                    "(docs/fit.md), and the noise is calibrated to spend the whole budget.",
        epilog=EXIT_TEXT)
    p.add_argument("data", metavar="DATA.jsonl", help="records, one JSON object per line ('-': stdin)")
    p.add_argument("--family", required=True, choices=FAMILIES)
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (default 1)")
    p.add_argument("--delta", type=float, default=1e-5, help="privacy budget delta (default 1e-5)")
    p.add_argument("--non-private", action="store_true", help="baseline without noise (no guarantee; the "
                   "message says private: false and epsilon_spent: null)")
    p.add_argument("--out", metavar="MODEL.json", required=True, help="write the final model message here")
    p.add_argument("--seed", type=int, default=None, help="fix the noise (reproduction only: reported as seeded)")
    p.add_argument("--dim", type=int, default=None, metavar="D",
                   help="the dimension d of the records (required): the length of each record's 'x' ('y' for "
                        f"sbn, its n_visible); public, so never read from the data; at most {MAX_DIM:,}")
    p.add_argument("--steps", type=int, default=None, help="override the rule's number of steps")
    p.add_argument("--ledger", metavar="PATH", default=None, help="keep the privacy ledger in this file")
    p.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                   help="a model parameter (JSON value), e.g. --param noise='\"gamma\"' --param y_bound=2")
    return p


def json_lines(raw: bytes) -> list[bytes]:
    """The records of a JSON Lines file: every line, blank or not, is one (N is public and must
    not change when a record is replaced by a blank line; a blank one is rejected as empty);
    the newline that ends the last line does not start another.

    >>> json_lines(b'{"x": [1]}\\n\\n  \\n{"x": [2]}\\n')
    [b'{"x": [1]}', b'', b'  ', b'{"x": [2]}']
    >>> json_lines(b""), json_lines(b"\\n")
    ([], [b''])
    """
    lines = raw.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def run(args: argparse.Namespace) -> int:
    """``stream-vips fit``: every check (arguments, data, ledger, --out) runs and the output file is
    reserved before anything is spent; a refusal is one line on stderr (exit codes in the
    epilog). The model is written atomically, or printed to stdout if that still fails after
    spending; a failure after spending keeps the last paid model the same way (exit 5)."""
    try:
        out = OutputFile(args.out, data=args.data, ledger=args.ledger)
        try:
            raw = sys.stdin.buffer.read() if args.data == "-" else Path(args.data).read_bytes()
        except OSError as exc:
            raise FitError(f"cannot read {args.data}: {exc.strerror or exc}") from None
        with _quiet_service_logs():
            plan = _prepare(json_lines(raw), args.family, args.epsilon, args.delta, dim=args.dim,
                            non_private=args.non_private, seed=args.seed, steps=args.steps, x_columns=None,
                            y_column=None, ledger_path=args.ledger, settings=None, model_id="fit",
                            model_params=dict(args.param), names=CLI_NAMES)
        out.reserve()
    except ValueError as exc:  # FitError, ConfigError and the models' own parameter checks
        return _refuse(exc)
    try:
        try:
            with _quiet_service_logs():
                result = _execute(plan)
        except SpentError as exc:
            return _failed_after_spending(exc, out)
        except ValueError as exc:  # building the pipeline refused (nothing spent), or no model
            return _refuse(exc)
        except Exception as exc:  # pragma: no cover - _execute turns failures after a step into SpentError
            return _failed_after_spending(SpentError(_error_text(exc), None, plan.non_private), out)
        error = out.write(messages.dumps(result.message) + b"\n")
    finally:
        out.discard()
    if error is not None:
        print(f"stream-vips fit: cannot write --out {out.path} ({error}); the budget is spent, so the model "
              "message is printed to stdout instead", file=sys.stderr)
    print(summary(result), file=sys.stderr)
    for line in result.report["warnings"]:
        print(f"stream-vips fit: warning: {line}", file=sys.stderr)
    return EXIT_CODES["written"] if error is None else EXIT_CODES["not_written"]


def _failed_after_spending(exc: SpentError, out: "OutputFile") -> int:
    """Keep the last paid model of a fit that failed after spending (--out, else stdout)
    and say so in one line; exit code 5."""
    where = "no model had been made"
    if exc.message is not None:
        error = out.write(messages.dumps(exc.message) + b"\n")
        where = (f"the last model was saved to {out.path}" if error is None else
                 f"--out {out.path} cannot be written ({error}), so the last model was printed to stdout")
    print(f"stream-vips fit: {exc.headline}; {where}", file=sys.stderr)
    return EXIT_CODES["spent"]


#: Exit codes of ``stream-vips fit`` (its epilog says them).
EXIT_CODES = {"written": 0, "no_model": 1, "bad_input": 2, "ledger": 3, "not_written": 4, "spent": 5}
EXIT_TEXT = ("exit codes: 0 a model was written; 1 no model (the reason is printed: no valid record, the budget "
             "already spent in the ledger, too many rejected records, a failure before any step was paid); 2 bad "
             "arguments or input; 3 the ledger refuses (not a ledger file, corrupt, or in use); 4 the model was made "
             "(the budget spent) but --out could not be written: it was printed to stdout; 5 the fit failed after "
             "spending (the error is printed): the model of the last paid step, if any, was saved to --out (or "
             "stdout if that failed). Nothing is spent unless the exit code is 0, 4 or 5.")


@contextlib.contextmanager
def _quiet_service_logs() -> Iterator[None]:
    """Silence the service's log lines (``stream_vips.*``) for one command-line fit: a refused
    step logs for operators of a long-running service, but here the reason is already in the one
    ``stream-vips fit:`` line (or the warnings), and two more unprefixed lines would only confuse.
    The ledger's warnings and errors still show, as ``stream-vips fit: warning:`` lines: a torn
    last line cut from the user's ledger file is something they must hear about."""
    logger, ledger_logger = logging.getLogger("stream_vips"), logging.getLogger("stream_vips.privacy.ledger")
    quiet, loud = logging.NullHandler(), logging.StreamHandler(sys.stderr)
    loud.setFormatter(logging.Formatter("stream-vips fit: warning: %(message)s"))
    saved = logger.propagate, ledger_logger.propagate, ledger_logger.level
    logger.addHandler(quiet)
    ledger_logger.addHandler(loud)
    logger.propagate = ledger_logger.propagate = False
    ledger_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(quiet)
        ledger_logger.removeHandler(loud)
        logger.propagate, ledger_logger.propagate = saved[:2]
        ledger_logger.setLevel(saved[2])


def _refuse(exc: Exception) -> int:
    """One line on stderr for a refused fit; the exit code of its kind."""
    print("stream-vips fit: " + " ".join(str(exc).splitlines()), file=sys.stderr)
    if isinstance(exc, NoModelError):
        return EXIT_CODES["no_model"]
    return EXIT_CODES["ledger"] if isinstance(exc, LedgerRefused) else EXIT_CODES["bad_input"]


class OutputFile:
    """``--out``, checked before the fit and reserved before it spends anything.

    The path must not be the data file (nor the file on stdin when the data is ``-``), the
    ledger (resolved paths, so links and relative spellings are caught) or any other privacy
    ledger (its first line is a ledger line: overwriting it would erase spent budget), must not
    be a directory or another non-regular file. :meth:`reserve` creates its directory the way
    the ledger's is and a temporary file next to it, which proves the directory writable (a
    fit that writes no model removes both); :meth:`write` fills it and renames it over the
    target (atomic: a reader sees the old file or the whole model, never part of one). An
    existing file keeps its mode, and a symlink stays a link: the temporary file is made in the
    link target's directory and renamed over the target. If that still fails after the budget
    was spent, the model goes to stdout so the spent budget is not lost.
    """

    def __init__(self, path: str, *, data: str, ledger: str | None) -> None:
        if path == "-":  # would make a file named "-": the model is a file, written atomically
            raise FitError("--out - is not supported: give a file path for the model (the summary goes to stderr)")
        self.path = Path(path)
        self._target = _resolve(self.path, "--out")  # a symlink's target is written, the link kept
        self._tmp: Path | None = None
        self._created: list[Path] = []  # directories reserve() made, deepest first
        self._written = False
        for flag, other, name in (("the data file", None if data == "-" else data, "the data file"),
                                  ("the --ledger file", ledger, "--ledger")):
            if other is not None and (self._target == _resolve(Path(other), name)
                                      or _same_file(self.path, Path(other))):
                raise FitError(f"--out {path} is {flag}: writing the model there would destroy it; "
                               "choose another --out")
        if data == "-" and _is_stdin(self.path):
            raise FitError(f"--out {path} is the data read from stdin: writing the model there would destroy it; "
                           "choose another --out")
        if self.path.is_dir():
            raise FitError(f"--out {path} is a directory; give a file name, e.g. {Path(path) / 'model.json'}")
        if self.path.exists() and not self.path.is_file():
            raise FitError(f"--out {path} is not a regular file; give a file path")
        if self.path.is_file():
            self._refuse_a_ledger(path)

    def _refuse_a_ledger(self, path: str) -> None:
        """Refuse an existing --out that is, or may be (it cannot be read), a privacy ledger: its
        first line begins like a ledger line, whether or not its checksum passes
        (:func:`~stream_vips.privacy.ledger.starts_like_ledger`)."""
        from stream_vips.privacy.ledger import starts_like_ledger

        try:
            first = read_first_line(self.path)
        except OSError as exc:
            raise FitError(f"--out {path} exists but cannot be read ({exc.strerror or exc}), so it may be a privacy "
                           "ledger, which the model must not replace; choose another --out") from None
        if starts_like_ledger(first):
            raise FitError(f"--out {path} is a privacy ledger (its first line begins like a ledger line): writing "
                           "the model there would erase the record of the spent budget; choose another --out")

    def reserve(self) -> None:
        """Create the directory and the temporary file (FitError when they cannot be)."""
        import os
        import tempfile

        # recorded before mkdir, so a failure partway (a name too long deeper down) still removes what it made
        self._created = [p for p in self._target.parents if not p.exists()]  # deepest first
        try:
            self._target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._target.parent, prefix=f".{self._target.name}.", suffix=".partial")
        except OSError as exc:
            self.discard()
            raise FitError(f"--out {self.path} cannot be written: {exc.strerror or exc}") from exc
        os.close(fd)
        self._tmp = Path(tmp)

    def write(self, data: bytes) -> str | None:
        """Write ``data`` to the target atomically and durably (the file, then its directory,
        fsynced); on failure print it to stdout. Returns ``None`` when the target holds it, else
        why it could not be written."""
        import os

        from stream_vips.privacy.ledger import fsync_dir

        try:
            if self._tmp is None:
                raise OSError("no temporary file was reserved")
            try:  # an existing file keeps its mode (a private 0600 model stays private)
                mode = os.stat(self._target).st_mode & 0o7777
            except FileNotFoundError:
                mask = os.umask(0)
                os.umask(mask)
                mode = 0o666 & ~mask
            with open(self._tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(self._tmp, mode)
            os.replace(self._tmp, self._target)
            self._tmp, self._written = None, True
        except OSError as exc:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return str(exc.strerror or exc)
        try:  # the rename itself must survive a crash; the file is whole either way
            fsync_dir(self._target.parent)
        except OSError as exc:
            print(f"stream-vips fit: warning: --out {self.path} is written, but its directory could not be synced "
                  f"({exc.strerror or exc}): a crash soon after may lose the rename", file=sys.stderr)
        return None

    def discard(self) -> None:
        """Remove the reserved temporary file if it is still there (no partial output) and, when
        no model was written, the directories :meth:`reserve` created (a refused fit leaves nothing)."""
        import os

        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None
        if not self._written:
            for directory in self._created:
                try:
                    directory.rmdir()
                except OSError:
                    if os.path.isdir(directory):  # no longer empty: something else put a file there
                        break
                    # never made: mkdir failed before it (or its name is too long to exist)
        self._created = []


def _resolve(path: Path, flag: str) -> Path:
    """``path`` made absolute with its symlinks followed; a symlink loop is a FitError (one line)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: a symlink loop before Python 3.13
        raise FitError(f"{flag} {path} cannot be resolved ({getattr(exc, 'strerror', None) or exc}): "
                       "a symlink loop? give a path that leads to a file") from None


def _is_stdin(path: Path) -> bool:
    """``path`` exists and is the file on standard input (same device and inode)."""
    import os

    try:
        st, out = os.fstat(0), os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)


def _same_file(a: Path, b: Path) -> bool:
    """Both exist and are the same file (a hard link has another resolved path)."""
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


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
    for key, why in r["why"].items():
        lines.append(f"  why {key}: {why}")
    return "\n".join(lines)
