"""DP-SGLD for logistic regression (Wang, Fienberg & Smola, ICML 2015, Algorithm 2, Theorem 4).

Model: y ~ Bernoulli(sigmoid(theta^T x)), prior N(0, alpha^-1 I), so the regularizer is
r(theta) = alpha ||theta||^2 / 2 and the per-record loss l(x, y; theta) = -log p(y | x, theta)
has gradient (sigmoid(theta^T x) - y) x, of norm <= ||x|| <= 1. Each per-record gradient is
still clipped to the Lipschitz constant L (``lipschitz``), so ||grad l|| <= L whatever the input.

Algorithm 2 with a constant step eta, minibatch size tau, N records and T data passes
(NT/tau iterations):

    theta <- theta - eta (grad r(theta) + (N / tau) sum_{i in S} grad l_i) + z_t,
    z_t ~ N(0, v I),  v = max(128 N T L^2 / (tau eps^2) log(2.5 N T / (tau delta)) log(2 / delta) eta^2, eta).

**The same update through the engine.** Write z_t = eta (N / tau) xi_t. Then
theta <- theta - eta (grad r + (N / tau)(sum_i grad l_i + xi_t)) with xi_t ~ N(0, s^2 I),
s = sqrt(v) tau / (eta N): Gaussian noise on the clipped gradient sum. In units of the
per-record bound L the noise multiplier is

    z = s / L = sqrt(v) tau / (eta N L),

which in the privacy branch of v (the first term) is z = sqrt(128 T tau log(2.5 N T / (tau delta))
log(2 / delta) / N) / eps, independent of eta; in the Langevin branch (v = eta) it is
z = tau / (N L sqrt(eta)). The engine adds exactly this noise (std z L on the sum, then divides by
the public normaliser tau), :meth:`DPSGLD.update` takes the step, and the release is accounted by
this project's accountants like every other event. (With Poisson sampling the normaliser is
q M = tau in expectation, the usual Poisson form of the minibatch estimate.)

**The paper's own condition** (Theorem 4): T >= eps^2 N / (32 tau log(2 / delta)). The model
refuses to be built when the configured (eps, delta, tau, T, N) violate it, and
:meth:`DPSGLD.check_noise_multiplier` (the engine calls it) refuses an engine noise multiplier below the z
above: then the
injected variance is below the paper's formula and its guarantee does not apply. Use
:meth:`DPSGLD.paper_noise_multiplier` as the engine's z.

>>> m = DPSGLD(dim=2, dataset_size=1000, batch_size=100, step_size=1e-3, epsilon=1.0,
...            delta=1e-5, passes=2.0)
>>> round(m.paper_noise_multiplier(), 3), m.iterations
(69.426, 20)
>>> DPSGLD(dim=2, dataset_size=10**6, batch_size=10, step_size=1e-3, epsilon=1.0, delta=1e-5, passes=1.0)
Traceback (most recent call last):
...
stream_vips.models.baselines.sgld.SgldConditionError: sgld privacy condition (Theorem 4): passes T = 1 < eps^2 N / (32 tau log(2/delta)) = 256
"""  # noqa: E501 (a doctest's expected output is one line)

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from scipy.special import expit

from stream_vips.errors import FitError, StreamVipsError
from stream_vips.models import summaries
from stream_vips.models._validate import integer, positive
from stream_vips.models.base import Block
from stream_vips.models.baselines import LogisticRecords
from stream_vips.models.fit_rule import Settings, accountant_for, gaussian_mu, why_accountant
from stream_vips.models.logistic import AUDIT_RECORDS
from stream_vips.privacy.mechanisms import clip_rows

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit


#: Fit-rule constants (:meth:`DPSGLD.fit_rule`): least and most full-batch steps, the share of the
#: exact Gaussian noise the rule asks the model to check for, and the slack of Theorem 4's condition
#: and of the paper's target (rounding must not break either).
RULE_MIN_STEPS, RULE_MAX_STEPS = 100, 100_000
RULE_MARGIN = 0.99
RULE_THEOREM4_SLACK, RULE_TARGET_SLACK = 1.01, 1.0 + 1e-6


#: The model's default prior precision alpha (the rule's stable step uses it).
_PRIOR_PRECISION = 1.0


def _gaussian_mu(epsilon: float, delta: float) -> float:
    """:func:`~stream_vips.fitting.rules.gaussian_mu`, a FitError beyond its range."""
    try:
        return gaussian_mu(epsilon, delta)
    except ValueError:
        raise FitError(f"sgld: epsilon {epsilon!r} at delta {delta!r} is beyond the rule's range") from None


def langevin_params(n: int, steps: int, epsilon: float | None, delta: float) -> dict[str, Any]:
    """The model parameters of ``steps`` full-batch steps on N = ``n`` records (:meth:`DPSGLD.fit_rule`):
    the step eta = 1 / z^2 at z = RULE_MARGIN sqrt(T) 2 / mu (``epsilon`` None: the stable step
    1 / (N/4 + alpha)), the paper's target at which Algorithm 2 asks for no more noise than that,
    the passes, and the second half of the steps kept as samples.

    >>> p = langevin_params(1000, 100, 1.0, 1e-5)
    >>> round(p["step_size"], 7), round(p["epsilon"], 2), p["burn_in"], p["keep"]
    (0.0001833, 22.09, 50, 50)
    """
    burn_in = steps // 2
    common = {"batch_size": n, "delta": delta, "passes": float(steps), "burn_in": burn_in,
              "keep": min(200, steps - burn_in)}
    if epsilon is None:
        return {**common, "step_size": 1.0 / (n / 4.0 + _PRIOR_PRECISION), "epsilon": 1.0}
    z = RULE_MARGIN * 2.0 * math.sqrt(steps) / _gaussian_mu(epsilon, delta)
    eta = 1.0 / z**2
    loglog = math.log(2.5 * steps / delta) * math.log(2.0 / delta)
    return {**common, "step_size": eta, "epsilon": math.sqrt(128.0 * steps * loglog * eta) * RULE_TARGET_SLACK}


class SgldConditionError(StreamVipsError, ValueError):
    """The configured DP-SGLD parameters violate the paper's privacy condition."""


class DPSGLD(LogisticRecords):
    """DP-SGLD logistic regression (records ``{"x": [d numbers], "y": 0 | 1}``): stochastic gradient
    Langevin dynamics whose Langevin noise is the Gaussian noise on the clipped gradient sum, with
    the paper's privacy condition (Theorem 4) checked; after ``burn_in`` updates every iterate is a
    posterior sample, and the last ``keep`` are kept for prediction (Bayesian model averaging).

    Parameters (public configuration):

    - ``batch_size``: tau, the expected batch;
    - ``step_size``: the constant eta;
    - ``epsilon``, ``delta``: the paper's target, which sets the noise Algorithm 2 asks for;
    - ``passes``: T, the data passes (N T / tau iterations);
    - ``lipschitz``: L, the clip of every per-record gradient;
    - ``prior_precision``: alpha of the prior N(0, alpha^-1 I);
    - ``burn_in``: updates before the iterates count as samples;
    - ``keep``: the samples kept for prediction.
    """

    family: ClassVar[str] = "sgld"

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """Algorithm 2 with its Langevin noise as the privacy noise: T full-batch steps (q = 1,
        tau = N) of step eta = 1 / z^2, for which Algorithm 2's Langevin variance is exactly the
        noise the budget calls for; T is the least with a stable step and Theorem 4's condition on
        the passes (at least :data:`RULE_MIN_STEPS`), the second half kept as samples, and the
        model's ``epsilon`` is the paper's target for that noise, looser than the budget the
        accountant certifies.

        At q = 1 the engine adds noise z L to the gradient sum, which Algorithm 2 reads as variance
        (eta N z L / tau)^2 = (eta z)^2 on theta (L = 1). The Langevin branch asks for v = eta,
        i.e. z = 1 / sqrt(eta), so the step eta = 1 / z^2 uses exactly the noise the budget calls
        for. No accountant certifies the budget with z below sqrt(T) D / mu (the exact Gaussian
        curve; D = 2, mu = :func:`~stream_vips.fitting.rules.gaussian_mu`); the rule takes 0.99 of
        it, so the calibrated z always meets the model's check. The model's ``epsilon`` (the paper's
        target, Theorem 4) is the smallest at which Algorithm 2 asks no more than that Langevin
        noise: the paper's analysis is looser than the accountant's, so it exceeds the budget,
        which the accountant's guarantee is. T is the smallest number of steps with (i) eta at
        most 1 / (N/4 + alpha), a stable step on the log-likelihood's curvature (|x| <= 1), and
        (ii) Theorem 4's condition on the passes, z^2 >= 4 log(2.5 T / delta); at least
        :data:`RULE_MIN_STEPS`, the second half of them kept as samples. Large budgets need many
        steps (T grows like mu^2 N): above :data:`RULE_MAX_STEPS` the rule refuses. Non-private:
        :data:`RULE_MIN_STEPS` noise-free steps at the stable step (gradient descent)."""
        if non_private:
            steps = RULE_MIN_STEPS
            why = {"steps": f"{steps} steps without noise at the stable step eta = 1/(N/4 + alpha): gradient descent",
                   "epsilon": "1: the paper's target is unused without noise (Theorem 4's condition holds)"}
        elif epsilon is None:
            raise FitError("sgld: a private fit needs epsilon (None only with non_private)")
        else:
            mu = _gaussian_mu(epsilon, delta)
            gap = RULE_MARGIN**2 * 4.0 / mu**2  # z^2 / T
            steps = max(RULE_MIN_STEPS, math.ceil((n / 4.0 + _PRIOR_PRECISION) / gap))
            while gap * steps < 4.0 * math.log(2.5 * steps / delta) * RULE_THEOREM4_SLACK:
                steps = math.ceil(4.0 * math.log(2.5 * steps / delta) * RULE_THEOREM4_SLACK / gap)
            if steps > RULE_MAX_STEPS:
                raise FitError(f"sgld at epsilon {epsilon!r}, delta {delta!r} and N = {n} needs {steps:,} full-batch "
                               f"steps for its Langevin noise to spend the budget (more than {RULE_MAX_STEPS:,}); "
                               "a smaller budget or data set fits")
            why = {"steps": (f"{steps} full-batch steps: eta = 1/z^2 at most 1/(N/4 + alpha) (stable) and Theorem 4's "
                             f"passes condition, z^2 >= 4 log(2.5 T / delta); at least {RULE_MIN_STEPS}"),
                   "step_size": (f"eta = 1/z^2 with z = {RULE_MARGIN} sqrt(T) 2 / mu: Algorithm 2's Langevin variance "
                                 "eta is then exactly the noise the budget calls for"),
                   "epsilon": ("the paper's target: the smallest at which Algorithm 2 asks for no more noise than its "
                               f"Langevin branch; the guarantee is the accountant's budget {epsilon:g}, which the "
                               "paper's looser analysis would need more noise for"),
                   "accountant": why_accountant(1.0)}
        why = {"q": "q = 1: Langevin steps on the full gradient sum; subsampling would need 1/q^2 as many steps for "
                    "the same noise", **why,
               "burn_in": "the first half of the steps; the second half are kept as posterior samples"}
        return Settings("sgld", n, d, epsilon, delta, 1.0, steps, 1.0, 1.0, None,
                        model_params=langevin_params(n, steps, epsilon, delta), why=why,
                        accountant=accountant_for(1.0))

    @classmethod
    def fit_complete(cls, settings: Settings, params: Mapping[str, Any]) -> Settings:
        """A step count other than the rule's gets its own step size, target, passes and samples
        (:func:`langevin_params`), so that the calibrated noise still meets Algorithm 2's."""
        if settings.model_params.get("passes") == settings.steps:
            return settings
        fresh = langevin_params(settings.n, settings.steps, settings.epsilon, settings.delta)
        return dataclasses.replace(settings, model_params={**settings.model_params, **fresh})

    def __init__(
        self,
        dim: int,
        dataset_size: int,
        batch_size: int,
        step_size: float,
        epsilon: float,
        delta: float,
        passes: float,
        lipschitz: float = 1.0,
        prior_precision: float = 1.0,
        burn_in: int = 0,
        keep: int = 200,
    ) -> None:
        self._init_records(dim, dataset_size)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or not 1 <= batch_size <= self.dataset_size:
            raise ValueError(f"batch_size must be an integer in [1, dataset_size], got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.step_size = positive("step_size", step_size)
        self.epsilon = positive("epsilon", epsilon)
        self.delta = positive("delta", delta)
        if not self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self.passes = positive("passes", passes)
        self.lipschitz = positive("lipschitz", lipschitz)
        self.prior_precision = positive("prior_precision", prior_precision)
        self.burn_in = integer("burn_in", burn_in, minimum=0)
        self.keep = max(1, integer("keep", keep, minimum=0))
        need = self.min_passes()
        if self.passes < need:
            raise SgldConditionError(
                f"sgld privacy condition (Theorem 4): passes T = {self.passes:g} < eps^2 N / "
                f"(32 tau log(2/delta)) = {need:.4g}")
        self.theta = np.zeros(self.dim)
        self._t = 0
        self._samples = np.zeros((0, self.dim))  # grows to keep rows as samples arrive
        self._n_samples = 0

    # ------------------------------------------------------------------ the paper's conditions
    def min_passes(self) -> float:
        """Theorem 4's lower bound on T: eps^2 N / (32 tau log(2 / delta))."""
        return self.epsilon**2 * self.dataset_size / (32.0 * self.batch_size * math.log(2.0 / self.delta))

    @property
    def iterations(self) -> int:
        """floor(N T / tau), the number of steps Algorithm 2 runs."""
        return int(math.floor(self.dataset_size * self.passes / self.batch_size))

    def paper_variance(self) -> float:
        """Algorithm 2's per-coordinate noise variance v at the configured constant step."""
        N, T, tau, eps, delta, L, eta = (self.dataset_size, self.passes, self.batch_size, self.epsilon,
                                         self.delta, self.lipschitz, self.step_size)
        private = (128.0 * N * T * L * L / (tau * eps * eps) * math.log(2.5 * N * T / (tau * delta))
                   * math.log(2.0 / delta) * eta * eta)
        return max(private, eta)

    def paper_noise_multiplier(self) -> float:
        """z = sqrt(v) tau / (eta N L): Algorithm 2's Langevin noise as gradient-sum noise over L."""
        scale = self.step_size * self.dataset_size * self.lipschitz
        return math.sqrt(self.paper_variance()) * self.batch_size / scale

    def check_noise_multiplier(self, noise_multiplier: float) -> None:
        """Refuse an engine noise multiplier that injects less variance than Algorithm 2 needs."""
        need = self.paper_noise_multiplier()
        if not noise_multiplier >= need * (1.0 - 1e-12):
            raise SgldConditionError(
                f"sgld privacy condition (Algorithm 2): noise multiplier {noise_multiplier:.6g} gives variance "
                f"{self.implied_variance(noise_multiplier):.6g} < {self.paper_variance():.6g}; need z >= {need:.6g}")

    def implied_variance(self, noise_multiplier: float) -> float:
        """Variance on theta of gradient noise with multiplier z: (eta N z L / tau)^2."""
        return (self.step_size * self.dataset_size * noise_multiplier * self.lipschitz / self.batch_size) ** 2

    @classmethod
    def audit(cls) -> FamilyAudit:
        """A label flip at one x at theta = 0: gradients +-x/2 clipped to L = 1/4, antiparallel."""
        from stream_vips.models.auditing import FamilyAudit

        # The model's own check needs the engine's z >= the paper's: with step 1 the Langevin
        # branch gives z = tau / (N L sqrt(eta)) = 4 at tau = N, L = 1/4.
        return FamilyAudit(
            "sgld", lambda capacity: DPSGLD(dim=2, dataset_size=capacity, batch_size=capacity, step_size=1.0,
                                            epsilon=9.7, delta=0.1, passes=1.0, lipschitz=0.25),
            AUDIT_RECORDS[:2], noise_multiplier=4.0,
            ratio_floor=0.99, floor_reason="attained: the clipped gradients at theta = 0 are antiparallel",
            note="at theta = 0 the gradients are +-x/2, clipped to L = 1/4: they differ by 2L, the "
                 "claimed diameter (z = 4 is the paper's minimum for this configuration)")

    # ------------------------------------------------------------------ release
    def blocks(self) -> tuple[Block, ...]:
        return (Block("grad", (self.dim,), self.lipschitz),)

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sum over the batch of per-record loss gradients (sigmoid(theta^T x) - y) x, clipped to L."""
        X, y = self._batch_xy(batch)
        g = (expit(X @ self.theta) - y)[:, None] * X
        return {"grad": clip_rows(g, self.lipschitz).sum(axis=0)}

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        """theta <- theta - eta (alpha theta + N m) with m the noisy mean gradient (rho unused)."""
        m = np.asarray(noisy_mean["grad"], dtype=float)
        if m.shape != (self.dim,):
            raise ValueError(f"noisy mean gradient must have shape ({self.dim},), got {m.shape}")
        self.theta = self.theta - self.step_size * (self.prior_precision * self.theta + self.dataset_size * m)
        self._t += 1
        if self._t > self.burn_in:
            row = self._n_samples % self.keep
            if row >= len(self._samples):  # memory follows what is held, not what keep allows
                grown = np.zeros((min(self.keep, max(1, 2 * len(self._samples))), self.dim))
                grown[:len(self._samples)] = self._samples
                self._samples = grown
            self._samples[row] = self.theta
            self._n_samples += 1

    # ------------------------------------------------------------------ state
    def samples(self) -> np.ndarray:
        """The kept posterior samples (the current iterate while still burning in)."""
        n = min(self._n_samples, self.keep)
        return self._samples[:n].copy() if n else self.theta[None, :].copy()

    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        d = integer("dim", hyperparameters["dim"])
        return {"theta": (d,), "samples": (None, d), "counters": (2,)}

    def state(self) -> dict[str, np.ndarray]:
        return {"theta": self.theta.copy(), "samples": self.samples(),
                "counters": np.array([self._t, self._n_samples], dtype=float)}

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        theta = np.asarray(state["theta"], dtype=float)
        samples = np.asarray(state["samples"], dtype=float)
        counters = np.asarray(state["counters"], dtype=float)
        if theta.shape != (self.dim,) or samples.ndim != 2 or samples.shape[1] != self.dim \
                or not 1 <= samples.shape[0] <= self.keep or counters.shape != (2,):
            raise ValueError(f"state shapes must be theta ({self.dim},), samples (<= {self.keep}, {self.dim}), "
                             f"counters (2,); got {theta.shape}, {samples.shape}, {counters.shape}")
        if samples.shape[0] != max(1, min(int(counters[1]), self.keep)):  # what samples() publishes
            raise ValueError(f"state holds {samples.shape[0]} samples but counts {int(counters[1])} (keep {self.keep})")
        self.theta = theta.copy()
        self._t, self._n_samples = int(counters[0]), int(counters[1])
        n = min(self._n_samples, self.keep)
        self._samples = samples[:n].copy()
        self._n_samples = n

    def hyperparameters(self) -> dict[str, Any]:
        return {"dim": self.dim, "dataset_size": self.dataset_size, "batch_size": self.batch_size,
                "step_size": self.step_size, "epsilon": self.epsilon, "delta": self.delta,
                "passes": self.passes, "lipschitz": self.lipschitz, "prior_precision": self.prior_precision,
                "burn_in": self.burn_in, "keep": self.keep}

    # ------------------------------------------------------------------ prediction
    def summary(self) -> dict[str, Any]:
        """The kept samples' mean and sd per coefficient, the samples themselves when few, and the
        rule :meth:`predict_proba` follows."""
        S = self.samples()
        out: dict[str, Any] = {
            "kind": "coefficients",
            "predictive": "p(y = 1 | x) = mean over the samples s of 1 / (1 + exp(-(s . x))), x clipped to L2 "
                          "norm <= x_clip = 1",
            "x_clip": 1.0, "mean": S.mean(axis=0).tolist(), "sd": S.std(axis=0).tolist(),
            "notes": ["DP-SGLD samples; mean and sd are over the kept samples"]}
        if S.size <= summaries.MATRIX_LIMIT**2:
            out["samples"] = S.tolist()
        else:
            out["notes"].append("samples omitted (too many numbers): the natural parameter samples holds them")
        return out

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Posterior predictive: mean of sigmoid(theta_s^T x) over the kept samples."""
        X = clip_rows(np.atleast_2d(np.asarray(X, dtype=float)), 1.0)
        return expit(X @ self.samples().T).mean(axis=1)
