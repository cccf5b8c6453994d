"""DP-SGLD for logistic regression (Wang, Fienberg & Smola, ICML 2015, Algorithm 2, Theorem 4).

Model: y ~ Bernoulli(sigmoid(theta^T x)), prior N(0, alpha^-1 I), so the regularizer is
r(theta) = alpha ||theta||^2 / 2 and the per-record loss l(x, y; theta) = -log p(y | x, theta)
has gradient (sigmoid(theta^T x) - y) x, of norm <= ||x|| <= 1. Each per-record gradient is
still clipped to the Lipschitz constant L (``lipschitz``), so ||grad l|| <= L whatever the input.

Algorithm 2 with a constant step eta, minibatch size tau, N records and T data passes
(NT/tau iterations):

    theta <- theta - eta (grad r(theta) + (N / tau) sum_{i in S} grad l_i) + z_t,
    z_t ~ N(0, v I),  v = max(128 N T L^2 / (tau eps^2) log(2.5 N T / (tau delta)) log(2 / delta) eta^2, eta).

**The same update through the engine.** Write the part of z_t the engine draws as
eta (N / tau) xi_t, xi_t ~ N(0, (z L)^2 I): Gaussian noise on the clipped gradient sum with noise
multiplier z, accounted by this project's accountant like every other family's release. The
engine divides the noisy sum by the public normaliser (tau = the expected batch q M) and tells the
model the noise std s = z L / tau on each entry of the released mean (:meth:`DPSGLD.set_noise_scale`),
so the privacy noise on theta has variance (eta N s)^2 per coordinate.

**The Langevin step follows from the noise** (``noise: accountant``, the default). The Langevin
branch of v asks for variance eta on theta; the privacy noise gives (eta N s)^2. They are equal at
eta_z = 1 / (N s)^2; the step is eta = min(eta_z, 1 / (N/4 + alpha)), the second term a stable step
on the log-posterior's curvature (|x| <= 1 makes the log-likelihood's Hessian at most N/4). When the
stable step binds, the privacy noise (eta N s)^2 = eta^2 / eta_z falls short of eta and the update
adds the rest, N(0, eta - (eta N s)^2), from the model's own generator: public randomness, so
post-processing (privacy rule 8). The total variance is max(privacy noise, eta), Algorithm 2's own
max. So the accountant calibrates z to the budget (privacy.epsilon, privacy.delta over
privacy.planned_steps), and the step, the batch and N come from the configuration: nothing here
repeats the budget or the batch. A given ``step_size`` replaces eta (the same top-up applies).

**The paper's own noise** (``noise: paper``). Algorithm 2's v with the budget as the paper's
target: tau = the expected batch, T = planned steps x tau / N passes, eps and delta the budget.
In units of L the engine's noise multiplier is then z = sqrt(v) tau / (eta N L), which in the
privacy branch is sqrt(128 T tau log(2.5 N T / (tau delta)) log(2 / delta) / N) / eps,
independent of eta (:class:`PaperNoise`). Theorem 4's condition T >= eps^2 N / (32 tau log(2 / delta))
is checked at start, and :meth:`DPSGLD.check_noise_multiplier` refuses an engine z below the
paper's. The paper's analysis is loose: our accountant certifies far less than the target for that
noise (0.036 of epsilon 1 in benchmarks/paper_claims.py's configuration), so most of the budget
stays unspent. The start warns with the epsilon the accountant certifies for the planned steps,
and every release's privacy section reports the accountant's spent epsilon.

>>> paper = PaperNoise(dataset_size=1000, batch=100, passes=2.0, epsilon=1.0, delta=1e-5, step_size=1e-3)
>>> round(paper.noise_multiplier(), 3), paper.iterations
(69.426, 20)
>>> PaperNoise(dataset_size=10**6, batch=10, passes=1.0, epsilon=1.0, delta=1e-5, step_size=1e-3).check()
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


#: Fit-rule constants (:meth:`DPSGLD.fit_rule`): least and most full-batch steps, and the share of
#: the exact Gaussian noise the rule plans for (so that the calibrated z always gives a stable step).
RULE_MIN_STEPS, RULE_MAX_STEPS = 100, 100_000
RULE_MARGIN = 0.99

#: The model's default prior precision alpha (the rule's stable step uses it).
_PRIOR_PRECISION = 1.0

#: The values of ``noise``: who sets the engine's noise multiplier.
NOISE_RULES = ("accountant", "paper")
#: What a summary says about each (the spent epsilon is the privacy section's, certified by the accountant).
NOISE_NOTES = {
    "accountant": "noise: accountant: the noise multiplier was calibrated to the budget by the accountant and "
                  "the Langevin step follows from it",
    "paper": "noise: paper: Algorithm 2's noise for the budget as the paper's target; privacy.epsilon_spent is "
             "what the accountant certifies for it, usually far below privacy.epsilon_budget (the paper's "
             "analysis is loose), so the rest of the budget was not used",
}


def _gaussian_mu(epsilon: float, delta: float) -> float:
    """:func:`~stream_vips.fitting.rules.gaussian_mu`, a FitError beyond its range."""
    try:
        return gaussian_mu(epsilon, delta)
    except ValueError:
        raise FitError(f"sgld: epsilon {epsilon!r} at delta {delta!r} is beyond the rule's range") from None


def sample_params(steps: int) -> dict[str, int]:
    """The first half of ``steps`` burnt in, the second half (at most 200) kept as samples.

    >>> sample_params(100)
    {'burn_in': 50, 'keep': 50}
    """
    burn_in = steps // 2
    return {"burn_in": burn_in, "keep": min(200, steps - burn_in)}


def stable_step(dataset_size: int, prior_precision: float) -> float:
    """1 / (N/4 + alpha): the log-posterior's curvature is at most N/4 + alpha when |x| <= 1."""
    return 1.0 / (dataset_size / 4.0 + prior_precision)


class SgldConditionError(StreamVipsError, ValueError):
    """The configured DP-SGLD parameters violate the paper's privacy condition."""


@dataclasses.dataclass(frozen=True)
class PaperNoise:
    """Algorithm 2's noise for the paper's target (``epsilon``, ``delta``) at N = ``dataset_size``,
    minibatch tau = ``batch``, T = ``passes`` and the constant step eta = ``step_size``."""

    dataset_size: int
    batch: float
    passes: float
    epsilon: float
    delta: float
    step_size: float
    lipschitz: float = 1.0

    @property
    def iterations(self) -> int:
        """floor(N T / tau), the number of steps Algorithm 2 runs."""
        return int(math.floor(self.dataset_size * self.passes / self.batch))

    def min_passes(self) -> float:
        """Theorem 4's lower bound on T: eps^2 N / (32 tau log(2 / delta))."""
        return self.epsilon**2 * self.dataset_size / (32.0 * self.batch * math.log(2.0 / self.delta))

    def check(self) -> None:
        """Refuse passes below Theorem 4's condition (:class:`SgldConditionError`)."""
        need = self.min_passes()
        if self.passes < need:
            raise SgldConditionError(
                f"sgld privacy condition (Theorem 4): passes T = {self.passes:g} < eps^2 N / "
                f"(32 tau log(2/delta)) = {need:.4g}")

    def variance(self) -> float:
        """Algorithm 2's per-coordinate noise variance v."""
        N, T, tau, eps, delta, L, eta = (self.dataset_size, self.passes, self.batch, self.epsilon, self.delta,
                                         self.lipschitz, self.step_size)
        private = (128.0 * N * T * L * L / (tau * eps * eps) * math.log(2.5 * N * T / (tau * delta))
                   * math.log(2.0 / delta) * eta * eta)
        return max(private, eta)

    def noise_multiplier(self) -> float:
        """z = sqrt(v) tau / (eta N L): Algorithm 2's noise as gradient-sum noise in units of L."""
        return math.sqrt(self.variance()) * self.batch / (self.step_size * self.dataset_size * self.lipschitz)

    def privacy_branch_multiplier(self) -> float:
        """The z of v's first branch: sqrt(128 T tau log(2.5 N T / (tau delta)) log(2 / delta) / N) / eps
        (eta and L cancel)."""
        N, T, tau, delta = self.dataset_size, self.passes, self.batch, self.delta
        loglog = math.log(2.5 * N * T / (tau * delta)) * math.log(2.0 / delta)
        return math.sqrt(128.0 * T * tau * loglog / N) / self.epsilon


class DPSGLD(LogisticRecords):
    """DP-SGLD logistic regression (records ``{"x": [d numbers], "y": 0 | 1}``): stochastic gradient
    Langevin dynamics whose Langevin noise is the Gaussian noise on the clipped gradient sum; after
    ``burn_in`` updates every iterate is a posterior sample, and the last ``keep`` are kept for
    prediction (Bayesian model averaging). The batch is the sampler's (expected batch q M), N is
    ``dataset_size`` and the noise is the engine's: the budget, the batch and the steps are the
    learner's options (privacy.epsilon, privacy.delta, sampling.batch_size, privacy.planned_steps).

    Parameters (public configuration):

    - ``noise``: who sets the engine's noise multiplier: ``"accountant"`` (calibrated to the
      budget, the Langevin step follows from it) or ``"paper"`` (Algorithm 2's formula with the
      budget as its target; the accountant certifies far less, which the start warns about; fit
      refuses it, since fit spends the whole budget);
    - ``step_size``: the constant eta (``None``: the Langevin step of the noise, at most the stable
      step 1 / (N/4 + alpha); Langevin noise the privacy noise does not cover is added);
    - ``lipschitz``: L, the clip of every per-record gradient;
    - ``prior_precision``: alpha of the prior N(0, alpha^-1 I);
    - ``burn_in``: updates before the iterates count as samples;
    - ``keep``: the samples kept for prediction;
    - ``seed``: the Langevin noise the update adds itself (public randomness: it carries no data).
    """

    family: ClassVar[str] = "sgld"
    retired_params: ClassVar[Mapping[str, str]] = {
        "batch_size": "the batch is the sampler's: set sampling.batch_size (batch_size= of PrivateLearner)",
        "epsilon": "the noise follows the budget: set privacy.epsilon (epsilon= of PrivateLearner); "
                   "noise: paper takes it as the paper's target",
        "delta": "the noise follows the budget: set privacy.delta (delta= of PrivateLearner)",
        "passes": "the steps are the learner's: set privacy.planned_steps (passes = steps x batch / N)",
    }

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """Algorithm 2 with its Langevin noise as the privacy noise: T full-batch steps (q = 1,
        tau = N), the accountant's z calibrated to the budget, and the step eta = 1 / z^2 the model
        takes from it (its Langevin step at q = 1, L = 1); T is the least with a stable step (at
        least :data:`RULE_MIN_STEPS`), the second half kept as samples.

        At q = 1 the engine adds noise z L to the gradient sum, which the update reads as variance
        (eta N z L / tau)^2 = (eta z)^2 on theta (L = 1). The Langevin branch asks for v = eta, so
        the step eta = 1 / z^2 uses exactly the noise the budget calls for. No accountant certifies
        the budget with z below sqrt(T) D / mu (the exact Gaussian curve; D = 2,
        mu = :func:`~stream_vips.fitting.rules.gaussian_mu`), so the rule plans with 0.99 of it: T is
        the smallest number of steps with eta at most 1 / (N/4 + alpha), a stable step on the
        log-likelihood's curvature (|x| <= 1), whatever z the calibration returns; at least
        :data:`RULE_MIN_STEPS`. Large budgets need many steps (T grows like mu^2 N): above
        :data:`RULE_MAX_STEPS` the rule refuses. Non-private: (N/4 + alpha) / alpha Langevin steps
        (within [:data:`RULE_MIN_STEPS`, :data:`RULE_MAX_STEPS`]) at the stable step with the
        Langevin noise only (the model adds it; seed 0): each step contracts the flattest
        direction, whose curvature is at least the prior's alpha, by eta alpha, so that many steps
        are one relaxation time there (with 100 steps the chain had not mixed: the non-private fit
        scored below the private ones on the declared benchmark table)."""
        if non_private:
            steps = min(RULE_MAX_STEPS, max(RULE_MIN_STEPS, math.ceil((n / 4.0 + _PRIOR_PRECISION) / _PRIOR_PRECISION)))
            why = {"steps": (f"{steps} Langevin steps at the stable step eta = 1/(N/4 + alpha), no privacy noise: "
                             "(N/4 + alpha) / alpha steps, one relaxation time of the flattest direction (the "
                             "prior's curvature alpha is the least the posterior has, and each step contracts it "
                             f"by eta alpha), between {RULE_MIN_STEPS} and {RULE_MAX_STEPS:,}")}
        elif epsilon is None:
            raise FitError("sgld: a private fit needs epsilon (None only with non_private)")
        else:
            mu = _gaussian_mu(epsilon, delta)
            gap = RULE_MARGIN**2 * 4.0 / mu**2  # z^2 / T
            steps = max(RULE_MIN_STEPS, math.ceil((n / 4.0 + _PRIOR_PRECISION) / gap))
            if steps > RULE_MAX_STEPS:
                raise FitError(f"sgld at epsilon {epsilon!r}, delta {delta!r} and N = {n} needs {steps:,} full-batch "
                               f"steps for its Langevin noise to spend the budget (more than {RULE_MAX_STEPS:,}); "
                               "a smaller budget or data set fits")
            why = {"steps": (f"{steps} full-batch steps: the least with eta = 1/z^2 at most 1/(N/4 + alpha) (a "
                             f"stable step); at least {RULE_MIN_STEPS}"),
                   "step_size": ("eta = 1/z^2 from the calibrated z (the model's Langevin step, noise: accountant): "
                                 "Algorithm 2's Langevin variance eta is then exactly the noise the budget calls for"),
                   "accountant": why_accountant(1.0)}
        why = {"q": "q = 1: Langevin steps on the full gradient sum; subsampling would need 1/q^2 as many steps for "
                    "the same noise", **why,
               "burn_in": "the first half of the steps; the second half are kept as posterior samples",
               "seed": "0: the Langevin noise the model adds is public randomness (no data enters it)"}
        return Settings("sgld", n, d, epsilon, delta, 1.0, steps, 1.0, 1.0, None,
                        model_params={**sample_params(steps), "seed": 0}, why=why, accountant=accountant_for(1.0))

    @classmethod
    def fit_complete(cls, settings: Settings, params: Mapping[str, Any]) -> Settings:
        """A step count other than the rule's burns in and keeps its own halves (:func:`sample_params`);
        ``noise: paper`` is refused (fit spends the whole budget, and the paper's noise spends a small
        percent of it under the accountant: a PrivateLearner or a stream runs it, with a warning)."""
        if params.get("noise", "accountant") == "paper" and settings.epsilon is not None:
            raise ValueError("noise: paper sets z by Algorithm 2's formula, which spends a small part of the "
                             "budget under the accountant, while fit spends the whole budget; run it with "
                             "PrivateLearner or a stream (which warn what it spends), or keep noise: accountant")
        fresh = sample_params(settings.steps)
        if all(settings.model_params.get(k) == v for k, v in fresh.items()):
            return settings
        return dataclasses.replace(settings, model_params={**settings.model_params, **fresh})

    def __init__(
        self,
        dim: int,
        dataset_size: int,
        noise: str = "accountant",
        step_size: float | None = None,
        lipschitz: float = 1.0,
        prior_precision: float = 1.0,
        burn_in: int = 0,
        keep: int = 200,
        seed: int | None = None,
    ) -> None:
        self._init_records(dim, dataset_size)
        if noise not in NOISE_RULES:
            raise ValueError(f"noise must be one of {', '.join(NOISE_RULES)}, got {noise!r}")
        self.noise = noise
        self.step_size = None if step_size is None else positive("step_size", step_size)
        self.lipschitz = positive("lipschitz", lipschitz)
        self.prior_precision = positive("prior_precision", prior_precision)
        self.burn_in = integer("burn_in", burn_in, minimum=0)
        self.keep = max(1, integer("keep", keep, minimum=0))
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._mean_std = 0.0  # the engine's noise std on the released mean gradient (set_noise_scale)
        self.paper: PaperNoise | None = None  # noise: paper, once the engine's plan is known
        self.theta = np.zeros(self.dim)
        self._t = 0
        self._samples = np.zeros((0, self.dim))  # grows to keep rows as samples arrive
        self._n_samples = 0

    # ------------------------------------------------------------------ noise and step
    def own_noise_multiplier(self, epsilon: float, delta: float, batch: float, steps: int) -> float | None:
        """``noise: paper``: Algorithm 2's z with the budget as its target, tau = ``batch`` (the
        expected batch), T = ``steps`` tau / N passes, after Theorem 4's condition; the step is
        ``step_size`` or the Langevin step of the privacy branch's z, at most the stable step.
        ``noise: accountant``: ``None`` (the accountant calibrates z)."""
        if self.noise != "paper":
            return None
        probe = PaperNoise(self.dataset_size, float(batch), steps * float(batch) / self.dataset_size, float(epsilon),
                           float(delta), 1.0, self.lipschitz)
        probe.check()
        eta = self.step_size
        if eta is None:
            z_private = probe.privacy_branch_multiplier()
            eta = min(self._stable(), (batch / (self.dataset_size * self.lipschitz * z_private)) ** 2)
        self.paper = dataclasses.replace(probe, step_size=eta)
        return self.paper.noise_multiplier()

    def check_noise_multiplier(self, noise_multiplier: float) -> None:
        """``noise: paper``: refuse an engine noise multiplier below Algorithm 2's."""
        if self.paper is None:
            return
        need = self.paper.noise_multiplier()
        if not noise_multiplier >= need * (1.0 - 1e-12):
            raise SgldConditionError(
                f"sgld privacy condition (Algorithm 2): noise multiplier {noise_multiplier:.6g} is below the "
                f"paper's z = {need:.6g} for its target epsilon {self.paper.epsilon:g}")

    def set_noise_scale(self, mean_stds: Mapping[str, float]) -> None:
        """s, the public noise std on each entry of the released mean gradient (z L / tau)."""
        self._mean_std = float(mean_stds["grad"])

    def _stable(self) -> float:
        return stable_step(self.dataset_size, self.prior_precision)

    @property
    def langevin_step(self) -> float:
        """eta: ``step_size``, else min(1 / (N s)^2, the stable step) (module docstring)."""
        if self.step_size is not None:
            return self.step_size
        scale = self.dataset_size * self._mean_std
        return self._stable() if scale == 0.0 else min(self._stable(), 1.0 / scale**2)

    def added_variance(self) -> float:
        """The Langevin variance the update adds itself: eta - (eta N s)^2 when positive."""
        eta = self.langevin_step
        return max(0.0, eta - (eta * self.dataset_size * self._mean_std) ** 2)

    @classmethod
    def audit(cls) -> FamilyAudit:
        """A label flip at one x at theta = 0: gradients +-x/2 clipped to L = 1/4, antiparallel."""
        from stream_vips.models.auditing import FamilyAudit

        return FamilyAudit(
            "sgld", lambda capacity: DPSGLD(dim=2, dataset_size=capacity, step_size=1.0, lipschitz=0.25),
            AUDIT_RECORDS[:2], noise_multiplier=4.0,
            ratio_floor=0.99, floor_reason="attained: the clipped gradients at theta = 0 are antiparallel",
            note="at theta = 0 the gradients are +-x/2, clipped to L = 1/4: they differ by 2L, the "
                 "claimed diameter")

    # ------------------------------------------------------------------ release
    def blocks(self) -> tuple[Block, ...]:
        return (Block("grad", (self.dim,), self.lipschitz),)

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sum over the batch of per-record loss gradients (sigmoid(theta^T x) - y) x, clipped to L."""
        X, y = self._batch_xy(batch)
        g = (expit(X @ self.theta) - y)[:, None] * X
        return {"grad": clip_rows(g, self.lipschitz).sum(axis=0)}

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        """theta <- theta - eta (alpha theta + N m) + N(0, :meth:`added_variance`) with m the noisy mean
        gradient and eta :attr:`langevin_step` (rho unused): post-processing of m and public noise."""
        m = np.asarray(noisy_mean["grad"], dtype=float)
        if m.shape != (self.dim,):
            raise ValueError(f"noisy mean gradient must have shape ({self.dim},), got {m.shape}")
        eta, extra = self.langevin_step, self.added_variance()
        self.theta = self.theta - eta * (self.prior_precision * self.theta + self.dataset_size * m)
        if extra > 0.0:
            self.theta = self.theta + math.sqrt(extra) * self._rng.standard_normal(self.dim)
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
        return {"dim": self.dim, "dataset_size": self.dataset_size, "noise": self.noise, "step_size": self.step_size,
                "lipschitz": self.lipschitz, "prior_precision": self.prior_precision, "burn_in": self.burn_in,
                "keep": self.keep}  # not seed: in a seeded run it is derived from the noise seed

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
            "notes": ["DP-SGLD samples; mean and sd are over the kept samples", NOISE_NOTES[self.noise]]}
        if S.size <= summaries.MATRIX_LIMIT**2:
            out["samples"] = S.tolist()
        else:
            out["notes"].append("samples omitted (too many numbers): the natural parameter samples holds them")
        return out

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Posterior predictive: mean of sigmoid(theta_s^T x) over the kept samples."""
        X = clip_rows(np.atleast_2d(np.asarray(X, dtype=float)), 1.0)
        return expit(X @ self.samples().T).mean(axis=1)
