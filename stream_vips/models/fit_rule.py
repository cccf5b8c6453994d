"""What a family's fit rule returns (:class:`Settings`) and what the rules share: the accountant
for a sampling rate and the reason for it, :func:`settings_from_rule` and the Gaussian mechanism's
mu. It sits with the models because every family states its own rule
(:meth:`stream_vips.models.base.Model.fit_rule`); :mod:`stream_vips.fitting` checks the inputs,
looks the rule up and runs the fit."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Version of the settings rule (reported with every fit).
RULE_VERSION = "fit_settings/4"


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


#: Why a rule takes q = 1 (every family that does).
WHY_Q = ("q = 1: the whole data set every step; subsampling's amplification (about q) is cancelled "
         "by its q times smaller normaliser when the noise is large, and it adds sampling noise")
_WHY_ACCOUNTANT = ("autodp: at q = 1 a step is a plain Gaussian mechanism, whose Renyi DP alpha D^2 / (2 z^2) "
                   "uses the model's proven diameter D (the pld accountant counts replace-one at diameter 2)")


def why_accountant(q: float) -> str:
    """The reason for :func:`accountant_for`'s choice at Poisson rate ``q``."""
    return _WHY_ACCOUNTANT if q == 1.0 else "pld: subsampled steps (q < 1), Poisson replace-one at diameter 2"


def settings_from_rule(family: str, n: int, d: int, epsilon: float | None, delta: float, non_private: bool,
                       rule: Mapping[str, Any]) -> Settings:
    """:class:`Settings` from a family's rule stated as a mapping (``q``, ``steps``, ``tau0``, ``kappa``,
    ``model_params``, ``why`` and optionally ``block_weights``), with the accountant for its q."""
    q = float(rule["q"])
    why = dict(rule["why"])
    if not non_private:
        why["accountant"] = why_accountant(q)
    return Settings(family, n, d, epsilon, delta, q, int(rule["steps"]), float(rule["tau0"]), float(rule["kappa"]),
                    rule.get("block_weights"), model_params=dict(rule["model_params"]), why=why,
                    accountant=accountant_for(q))


def gaussian_mu(epsilon: float, delta: float) -> float:
    """mu of the Gaussian mechanism (mu-GDP: sensitivity over noise std) that is exactly
    (``epsilon``, ``delta``)-DP: the root of delta(epsilon, mu) = Phi(-epsilon/mu + mu/2) - e^epsilon
    Phi(-epsilon/mu - mu/2) = ``delta``, solved in ln mu with e^epsilon kept inside the log (it
    overflows a float from epsilon 710). No accountant certifies (epsilon, delta) with less noise
    than sensitivity / mu (the Gaussian curve is exact). Defined for mu in [1e-12, 1e4].

    >>> round(gaussian_mu(1.0, 1e-5), 4)
    0.2681
    """
    from scipy.optimize import brentq
    from scipy.stats import norm

    def gdp_delta(log_mu: float) -> float:
        mu = math.exp(log_mu)
        return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon + norm.logcdf(-epsilon / mu - mu / 2)))

    return math.exp(brentq(lambda t: gdp_delta(t) - delta, math.log(1e-12), math.log(1e4), xtol=1e-13, rtol=1e-13))
