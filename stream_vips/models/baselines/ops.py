"""OPS: one posterior sample (Wang, Fienberg & Smola, ICML 2015, Alg. 1, Thm 1), released uncertified.

Model: logistic regression, log p(y | x, theta) = log sigmoid(t theta^T x) with t = 2y - 1, prior
N(0, alpha^-1 I) restricted to the ball ||theta|| <= R.

**Bounded log-likelihood by clipping.** Rows are clipped to ||x|| <= 1 (record handling shared
with the logistic family), labels are mapped to t in {-1, +1} behind the wall (t = +1 iff
y > 1/2, whatever the reservoir holds), and theta is restricted to ||theta|| <= R, so
|t theta^T x| <= R and

    0 <= -log p(y | x, theta) = log(1 + exp(-t theta^T x)) <= log(1 + e^R) = B.

**Algorithm 1.** rho = min(1, eps / (4B)); release one sample of the tempered posterior
p_rho(theta | X) ∝ exp(rho sum_n log p(y_n | x_n, theta)) pi(theta)^rho on the ball. Theorem 1
(the exponential mechanism with utility the log-likelihood, whose replace-one range is B):
an *exact* sample is 4 rho B-DP, i.e. eps-DP when eps < 4B and 4B-DP otherwise
(:attr:`OPS.nominal_epsilon`), under replace-one adjacency on the N records of the full reservoir.

**Why the release is uncertified.** The sample here is the end of a random-walk Metropolis
chain, not an exact sample, and no guarantee is proven for it:

* An approximate sampler within total variation gamma of the target is
  (eps, (1 + e^eps) gamma)-DP (the paper's Proposition 3), but bounding gamma for this chain needs
  a mixing-time bound with explicit constants, which we do not have (the proposal scale is even
  adapted during the chain).
* An exact sampler on the ball exists: propose theta from the prior restricted to the ball and
  accept with probability exp(rho sum_n log p(y_n | x_n, theta)) <= 1. Its acceptance rate
  E_prior[exp(rho sum_n log p)] is at most exp(-rho N L), with L the smallest average log-loss
  on the ball; for data that are not separable L is a constant, so the rate falls exponentially
  in N (eps = 1, R = 5, N = 26,000 records with L = 0.3: below e^-389). A cap on the number of
  proposals would make it inexact again, and its run time depends on the data.

So :meth:`OPS.event` is an :class:`~stream_vips.privacy.events.UncertifiedEvent` carrying the
nominal epsilon and the reason. Every accountant refuses it (``UnsupportedEvent``), so
:meth:`OPS.release` through an ordinary budget monitor raises before anything is appended or
sampled (privacy rule 10 in docs/privacy.md). The only way to release is an explicit opt-in:
a monitor built on :class:`AssumeExactSampling`, which accounts the event as pure
``nominal_epsilon``-DP *under the stated assumption* that the chain is an exact sample. The
ledger still holds the uncertified event, so a restart with a plain accountant refuses it. The
baseline harness uses the opt-in and reports OPS as uncertified, not as a private result.

**Streaming.** The sample is drawn from the whole reservoir (N = its capacity; the reservoir must
be full, privacy rule 5) by :meth:`OPS.release`: it builds the event, has the budget monitor
check it and append it to the ledger, and only then samples; a refusal halts and releases
nothing. OPS releases no Gaussian statistic, so the engine's ``step`` does not apply:
:meth:`OPS.blocks` raises, which makes a pipeline configured with ``family: ops`` fail at start.

**Sampler.** Random-walk Metropolis (vectorized over the reservoir: one matrix-vector product per
proposal) on the tempered, restricted posterior, started at 0 (data independent), proposal
scale adapted during the first half of the chain to an acceptance rate near 0.25 and frozen
for the second half.

>>> ops = OPS(dim=2, dataset_size=100, epsilon=1.0, radius=3.0)
>>> round(ops.log_lik_bound, 4), round(ops.rho, 5), ops.nominal_epsilon
(3.0486, 0.08201, 1.0)
>>> ops.event().certified
False
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from scipy.special import expit, log_expit

from stream_vips.errors import ReservoirNotFull
from stream_vips.models._validate import integer, positive
from stream_vips.models.base import Block
from stream_vips.models.baselines import LogisticRecords
from stream_vips.privacy.accountants import Accountant
from stream_vips.privacy.events import PureDpEvent, UncertifiedEvent
from stream_vips.privacy.mechanisms import clip_rows

if TYPE_CHECKING:
    from stream_vips.privacy.event_types import Event

#: Target acceptance rate of the adaptive random-walk phase.
_TARGET_ACCEPT = 0.25

#: Why an OPS release has no proven guarantee (carried by its ledger event).
UNCERTIFIED_REASON = (
    "Theorem 1 of Wang et al. (2015) needs an exact sample of the tempered posterior; the release "
    "is the end of an adaptive random-walk Metropolis chain with no bound on its total-variation "
    "distance to the target, so neither pure eps-DP nor an (eps, delta) with bounded delta is proven"
)


class HeldRecords(Protocol):
    """The reservoir OPS releases from (the core's; named by what is read of it)."""

    @property
    def capacity(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def full(self) -> bool: ...

    def take(self, indices: np.ndarray) -> dict[str, np.ndarray]: ...


class Admits(Protocol):
    """The budget monitor's admission (check, then a durable ledger entry) of OPS's event."""

    def admit(self, event: Event, position: int | None = None) -> int | None: ...


class OPS(LogisticRecords):
    """One posterior sample of logistic regression at target ``epsilon`` (records ``{"x": [d
    numbers], "y": 0 | 1}``): the exponential mechanism of Wang et al.'s Algorithm 1, released by
    :meth:`release` through a random-walk Metropolis chain, not through the engine, and therefore
    uncertified (module docstring).

    Parameters (public configuration):

    - ``epsilon``: the target of Algorithm 1 (nominal: an exact sample would be epsilon-DP);
    - ``radius``: R, theta is restricted to the ball of radius R;
    - ``prior_precision``: alpha of the prior N(0, alpha^-1 I);
    - ``mcmc_steps``: the chain's length.
    """

    family: ClassVar[str] = "ops"
    engine_refusal: ClassVar[str | None] = (
        "it releases one posterior sample through OPS.release, not the engine, and that release is "
        "uncertified (every accountant refuses its event), so no budget can be calibrated or promised")

    @classmethod
    def audit(cls) -> str:
        """Not audited: the release claims no certified guarantee (the string says why)."""
        return ("releases one posterior sample through OPS.release, not the engine, and claims no "
                "certified guarantee (its event is uncertified and every accountant refuses it), so "
                "there is no claim to test; auditing a nominal claim needs a sampler-specific test")

    def __init__(
        self,
        dim: int,
        dataset_size: int,
        epsilon: float,
        radius: float = 5.0,
        prior_precision: float = 1.0,
        mcmc_steps: int = 4000,
    ) -> None:
        self._init_records(dim, dataset_size)
        self.epsilon = positive("epsilon", epsilon)
        self.radius = positive("radius", radius)
        self.prior_precision = positive("prior_precision", prior_precision)
        self.mcmc_steps = integer("mcmc_steps", mcmc_steps, minimum=2)
        self.theta = np.zeros(self.dim)
        self.acceptance = math.nan

    # ------------------------------------------------------------------ Algorithm 1's constants
    @property
    def log_lik_bound(self) -> float:
        """B = log(1 + e^R) >= |log p(y | x, theta)| for ||x|| <= 1, ||theta|| <= R."""
        return float(np.logaddexp(0.0, self.radius))

    @property
    def rho(self) -> float:
        """The likelihood (and prior) temperature min(1, eps / (4B))."""
        return min(1.0, self.epsilon / (4.0 * self.log_lik_bound))

    @property
    def nominal_epsilon(self) -> float:
        """Theorem 1's guarantee for an exact sample: 4 rho B (= eps unless eps > 4B)."""
        return 4.0 * self.rho * self.log_lik_bound

    def event(self) -> UncertifiedEvent:
        """The ledger event of one release: uncertified (module docstring), nominal epsilon kept."""
        return UncertifiedEvent("ops", self.nominal_epsilon, UNCERTIFIED_REASON, adjacency="replace_one")

    def log_target(self, theta: np.ndarray, X: np.ndarray, t: np.ndarray) -> np.ndarray:
        """log p_rho(theta | X) up to a constant, for a (k, d) stack of theta; -inf off the ball."""
        theta = np.atleast_2d(theta)
        ll = log_expit((X @ theta.T) * t[:, None]).sum(axis=0)
        lp = -0.5 * self.prior_precision * np.einsum("kd,kd->k", theta, theta)
        out = self.rho * (ll + lp)
        return np.where(np.linalg.norm(theta, axis=1) <= self.radius, out, -np.inf)

    # ------------------------------------------------------------------ release
    def sample(self, X: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Random-walk Metropolis on the tempered, restricted posterior (behind the wall).

        Rows are clipped to norm 1 and labels mapped to t = +1 iff y > 1/2 (NaN -> -1), so the
        log-likelihood bound B holds whatever the reservoir holds.
        """
        X = clip_rows(np.asarray(X, dtype=float), 1.0)
        t = np.where(np.asarray(y, dtype=float) > 0.5, 1.0, -1.0)
        theta = np.zeros(self.dim)
        current = self.log_target(theta, X, t)[0]
        # public starting scale: the prior-and-data curvature rho (alpha + N/4) bounds the Hessian
        scale = 2.38 / math.sqrt(self.dim * self.rho * (self.prior_precision + 0.25 * self.dataset_size / self.dim))
        adapt = self.mcmc_steps // 2
        accepted = 0
        noise = rng.standard_normal((self.mcmc_steps, self.dim))
        logu = np.log(rng.random(self.mcmc_steps))
        for i in range(self.mcmc_steps):  # a chain is sequential; each step is one vectorized pass
            proposal = theta + scale * noise[i]
            value = self.log_target(proposal, X, t)[0]
            ok = logu[i] < value - current
            if ok:
                theta, current = proposal, value
            if i < adapt:
                scale *= math.exp((float(ok) - _TARGET_ACCEPT) / math.sqrt(i + 1.0))
            elif ok:
                accepted += 1
        self.acceptance = accepted / max(1, self.mcmc_steps - adapt)
        return theta

    def release(self, reservoir: HeldRecords, monitor: Admits, rng: np.random.Generator) -> int | None:
        """Check and ledger the event, then draw the sample; ``None`` if the budget refuses.

        With an ordinary accountant the monitor raises ``UnsupportedEvent`` (the event is
        uncertified) before anything is appended or sampled; see :class:`AssumeExactSampling`.
        """
        if reservoir.capacity != self.dataset_size:
            raise ValueError(f"reservoir capacity {reservoir.capacity} != dataset_size {self.dataset_size}")
        if not reservoir.full:
            raise ReservoirNotFull(
                f"reservoir holds {reservoir.size} of {reservoir.capacity} records; no release until full")
        step = monitor.admit(self.event())
        if step is None:
            return None
        rows = reservoir.take(np.arange(reservoir.size))
        self.theta = self.sample(rows["x"], rows["y"], rng)
        return step

    # ------------------------------------------------------------------ the Gaussian protocol does not apply
    def blocks(self) -> tuple[Block, ...]:
        raise ValueError("the ops family releases one posterior sample (an approximate exponential "
                         "mechanism, uncertified), not Gaussian statistics; run it with OPS.release, not the engine")

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise ValueError("ops has no clipped sum: use OPS.release")

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        raise ValueError("ops has no M-step on noisy statistics: use OPS.release")

    # ------------------------------------------------------------------ state
    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        return {"theta": (integer("dim", hyperparameters["dim"]),)}

    def state(self) -> dict[str, np.ndarray]:
        return {"theta": self.theta.copy()}

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        theta = np.asarray(state["theta"], dtype=float)
        if theta.shape != (self.dim,) or not np.all(np.isfinite(theta)):
            raise ValueError(f"state theta must be finite with shape ({self.dim},), got {theta.shape}")
        self.theta = theta.copy()

    def hyperparameters(self) -> dict[str, Any]:
        return {"dim": self.dim, "dataset_size": self.dataset_size, "epsilon": self.epsilon,
                "radius": self.radius, "prior_precision": self.prior_precision, "mcmc_steps": self.mcmc_steps}

    def summary(self) -> dict[str, Any]:
        """The released sample and the rule :meth:`predict_proba` follows (one sample: no sd)."""
        return {"kind": "coefficients", "x_clip": 1.0,
                "predictive": "p(y = 1 | x) = 1 / (1 + exp(-(mean . x))), x clipped to L2 norm <= x_clip = 1",
                "mean": self.theta.tolist(), "notes": ["one posterior sample (OPS): mean is the sample, no sd"]}

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """sigmoid(theta^T x) for the released sample."""
        X = clip_rows(np.atleast_2d(np.asarray(X, dtype=float)), 1.0)
        return expit(X @ self.theta)


class AssumeExactSampling(Accountant):
    """Explicit opt-in: account OPS's uncertified releases as if its chain were an exact sample.

    Wraps an accountant; an :class:`UncertifiedEvent` of ``mechanism == "ops"`` is accounted as
    ``PureDpEvent(nominal_epsilon)``, everything else goes to ``inner`` unchanged. This is not a
    privacy guarantee: it is the stated assumption under which the nominal epsilon would hold
    (for tests and the baseline harness, which report the result as uncertified). The ledger
    keeps the uncertified event, so a plain accountant still refuses it on replay.
    """

    def __init__(self, inner: Accountant) -> None:
        self.inner = inner
        self.name = f"{inner.name}+assume_exact_sampling"

    @staticmethod
    def as_if_exact(event: object) -> object:
        """The pure-DP event OPS's release would be with an exact sampler; other events unchanged."""
        if isinstance(event, UncertifiedEvent) and event.mechanism == "ops":
            return PureDpEvent(event.nominal_epsilon, event.adjacency, event.count)
        return event

    def why_unsupported(self, event: object) -> str | None:
        return self.inner.why_unsupported(self.as_if_exact(event))

    def epsilon_of_counts(self, counts: Mapping[Any, int], delta: float) -> float:
        """``inner``'s epsilon of ``counts``, OPS's events taken as exact (the keys are events of every
        kind, wider than the accountants' ``Counts`` alias states)."""
        merged: OrderedDict = OrderedDict()
        for unit, n in counts.items():
            key = self.as_if_exact(unit)
            merged[key] = merged.get(key, 0) + n
        return self.inner.epsilon_of_counts(merged, delta)
