"""The settings rule of ``fit``: every setting from public quantities only (N, d, the family,
epsilon, delta), never from the data being fitted (derivation and evidence in docs/fit.md)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

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


#: How the caller names each input of :func:`fit`: Python keywords, or the command's flags.
PYTHON_NAMES = {"dim": "dim=D", "epsilon": "epsilon", "ledger": "ledger_path", "param": "the caller",
                "steps": "the caller"}
CLI_NAMES = {"dim": "--dim D", "epsilon": "--epsilon", "ledger": "--ledger", "param": "--param", "steps": "--steps"}


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
    (its dominating pair is only known for 2; stream_vips/privacy/accountants/), so for the
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
    what the calibration can resolve (:data:`~stream_vips.privacy.accountants.MIN_CALIBRATION_RTOL`)."""
    if family not in RULES:
        raise FitError(f"fit has a settings rule for the families {list(FAMILIES)}, not {family!r}")
    if not non_private and not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise FitError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise FitError(f"delta must be in (0, 1), got {delta!r}")
    if not non_private:
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
    call = {"family": family, "n": n, "d": d, "epsilon": None if non_private else float(epsilon),
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
