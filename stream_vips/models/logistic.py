"""VIPS Bayesian logistic regression with Pólya-Gamma augmentation (VIPS JAIR 2020, Algorithm 5).

Model (paper eq. 43): y_n ~ Bernoulli(sigmoid(m^T x_n)), m | alpha ~ N(0, alpha^-1 I),
alpha ~ Gamma(a0, b0) (shape, rate). Pólya-Gamma augmentation (eqs. 45-47) makes the likelihood
conditionally Gaussian in m, with per-record sufficient statistics

    s1(x, y) = (y - 1/2) x          s2(x, omega) = omega x x^T,   omega ~ PG(1, c).

**E-step (behind the privacy wall).** With q(m) = N(mu, Sigma), q(omega_n) = PG(1, c_n) with
c_n^2 = x_n^T E[m m^T] x_n and E[m m^T] = Sigma + mu mu^T (eq. 49), whose mean is
E[omega_n] = tanh(c_n / 2) / (2 c_n) (1/4 at c = 0). The batch sums
S1 = sum (y_n - 1/2) x_n and S2 = sum E[omega_n] x_n x_n^T are what the engine releases.

**M-step (post-processing, eqs. 51-55).** From the privatized means s1, s2 and the configured
dataset size N (the reservoir capacity, privacy rule 5 in docs/privacy.md) the step's natural parameters are
nu_t = [N s1, N s2 + <alpha> I] (eq. 54), blended nu <- (1 - rho) nu + rho nu_t. The blend keeps
the data part S = blend of N s2 and the prior part A = blend of <alpha> separately, and the
precision is P = N proj(S / N) + A I; then Sigma = P^-1, mu = Sigma h, and q(alpha) =
Gamma(a0 + d/2, b0 + (mu^T mu + tr Sigma) / 2) (eq. 53). ``proj`` (``project_pd``) raises the
eigenvalues of the averaged noisy statistic to a floor computed from public quantities only: the
noise std of one diagonal entry of S / N, which the blend shrinks (variance v <- (1 - rho)^2 v +
rho^2 std^2 per step), times ``floor_factor * sqrt(d)``, about the noise's spectral norm (see
:meth:`BayesianLogisticRegression.set_noise_scale`). So P >= A I is always positive definite.
The paper projects each step's s2 before blending; projecting after the blend is also
post-processing, and its bias (of the order of the noise spectral norm) shrinks with the
averaging instead of accumulating.

**Sensitivity.** Inputs are clipped to ||x|| <= 1 (a bias feature, if wanted, is part of x and
inside the bound); y is 0 or 1, so |y - 1/2| = 1/2 exactly, and 0 < E[omega] <= 1/4. Parsing
rejects any other label, and :meth:`BayesianLogisticRegression.clipped_sum` enforces both again
behind the wall (rows re-clipped, labels mapped to 1 if y > 1/2 else 0, NaN to 0), so the
bounds below hold whatever the reservoir holds.

* Per-record bounds (``Block.bound``): ||(y - 1/2) x|| = ||x|| / 2 <= C1 = 1/2 and
  ||E[omega] x x^T||_F = E[omega] ||x||^2 <= C2 = 1/4.
* Replace-one, per block. s1: ||u - u'|| <= ||u|| + ||u'|| <= 1 = 2 C1, reached by x' = x and
  flipped y. s2: both contributions are PSD, so <A, A'>_F = omega omega' (x^T x')^2 >= 0 and
  ||A - A'||_F^2 = ||A||^2 + ||A'||^2 - 2 <A, A'> <= 2 C2^2, i.e. sqrt(2) C2 = sqrt(2)/4
  (x orthogonal to x'). The paper's bounds (eqs. 57, 59: 2 |y - 1/2| <= 2, i.e. 2x loose, and
  2 C2) are looser.
* Replace-one, jointly. The engine adds N(0, (z C_k / a_k)^2) to block k (weights a_k, sum a_k^2
  = 1): equivalently block k is scaled by w_k = a_k / C_k (w1 = 2 a1, w2 = 4 a2), every record's
  scaled contribution has norm <= 1, and unit noise of multiplier z is added. The diameter D is
  the sup of the scaled change. Write r = ||x||, r' = ||x'||, t = sign((y - 1/2)(y' - 1/2)) cos(x, x'),
  p = omega r^2, p' = omega' r'^2. Then
  D^2 = sup w1^2 (r^2 + r'^2 - 2 t r r') / 4 + w2^2 (p^2 + p'^2 - 2 t^2 p p').
  omega and omega' range independently over (0, 1/4]: E[m m^T] is any PD matrix (it comes from
  earlier releases), and for non-parallel x, x' one can make c(x) and c(x') independently small
  or large. Expanding, D^2 = |g|^2 + |g'|^2 + max_t (-2 a t - 2 b t^2) with a = w1^2 r r' / 4,
  b = w2^2 p p'; the max is phi(a, b) = 2a - 2b if a >= 2b, else a^2 / (2b). For fixed p, p',
  |g|^2 + |g'|^2 and phi (increasing in a) both grow with r and r', and the constraint
  p <= r^2 / 4 only loosens, so the sup is at r = r' = 1. There, if a >= 2b the value is
  w1^2 + w2^2 (p - p')^2 <= w1^2 + w2^2 / 16 (p = 1/4, p' -> 0, x' -> -+x); if a < 2b it is
  w1^2 / 2 + w2^2 (p^2 + p'^2) + w1^4 / (32 w2^2 p p'), convex in (p, p') on the convex region
  pp' > w1^2 / (8 w2^2), so its max is on the region's boundary (where it equals the first case)
  or at p = p' = 1/4. Hence, with a1^2 + a2^2 = 1,

      D^2 = max(4 a1^2 + a2^2,  2 + a1^4 / (2 a2^2)  [only if a1^2 < 2 a2^2]) <= 4.

  For the default weights a_k = C_k / sqrt(C1^2 + C2^2) (a1^2 = 0.8) D = sqrt(3.4) ~ 1.844 < 2.
  :meth:`diameter` computes D for the engine's weights (without them: 2, which holds for any
  allocation); tests check D against random and optimized worst cases. D buys less noise only
  through an accountant that uses it: autodp (Renyi DP, sigma = z / D) does for fixed-size
  sampling and at q = 1, where a step is a plain Gaussian mechanism of sensitivity D; the PLD
  accountant counts a replace-one step at diameter 2. ``stream_vips.fit`` (q = 1) therefore
  accounts with autodp: z = 7.59 instead of 10.55 for its two steps at epsilon 1, delta 1e-5.

**Centred release** (``release="centred"``; ``stream_vips.fit`` takes it from N >= 1,000 and d >= 6,
docs/fit.md). The mean of q(m)
depends on s1 and s2 through mu = P^-1 h, so the noise on s2 reaches the mean multiplied by mu
(P^-1 E mu), and the eigenvalue floor that keeps P invertible biases it. Instead of s1 the step
releases the residual statistic

    g(x, y) = clip(y - 1/2 - E[omega] x^T m_t, -C_r, C_r) x

at the current iterate m_t (public: it comes from earlier releases), i.e. the gradient of the
Pólya-Gamma ELBO in the mean, sum_n (kappa_n - E[omega_n] x_n^T m) x_n = s1 - S2 m. The M-step
moves the iterate by a preconditioned step m_{t+1} = m_t + lr_t P^-1 (N g - A m_t) (lr_0 = 1:
from m_0 = 0 the first step is exactly the s1 release, since g = s1 at m = 0; then
``step_size``), and the published mean is the average of the iterates after update
``average_from``. The precision P (from the blended s2, floored as above) only preconditions:
where the steps settle, N g = A m whatever P is, so neither the s2 noise nor the floor moves the
fixed point (with C_r >= 1, which never binds, it is the batch VB fixed point; the clip 1/2 moves
it, see below); the noise on g is averaged over the iterates. Without clipping |y - 1/2 - E[omega]
x^T m| < 1 (E[omega] c = tanh(c/2) / 2 < 1/2 and |x^T m| <= c); the clip C_r (``residual_clip``,
1/2 by default: the bound of s1) only binds for records the iterate misclassifies, like a
bounded-influence loss, and where it binds the fixed point moves towards them less.

Its bound is ||g|| <= C_r ||x|| <= C_r, and the diameter is that of (s1, s2) above with C1 = C_r:
the scaled s1 part there is (y - 1/2) x / C1 with (y - 1/2) / C1 = +-1, here r x / C_r with
r / C_r in [-1, 1]. For fixed x, x', omega, omega' the squared distance is a convex quadratic in
(r, r') (the squared norm of a linear function of them), so its sup over the box [-1, 1]^2 is
at a corner, +-1: the case above. The residual's dependence on omega only restricts the pairs
that can occur. So :func:`joint_diameter` holds unchanged for the weights of (g, s2), and per key
(:meth:`BayesianLogisticRegression.group_diameter`) too.

Length: over the project's 600-line guide because a family is one module: besides the model
it holds everything the package knows about the family (its fit rule, synthetic data, demo and
audit pair: the hooks of :class:`~stream_vips.models.base.Model`).

>>> import numpy as np
>>> model = BayesianLogisticRegression(dim=2, dataset_size=100)
>>> parsed = model.parse_batch([{"x": [3.0, 4.0], "y": 1}, {"x": [0.1, 0.2], "y": 0.5}])
>>> parsed.rows["x"].round(2).tolist(), [reason for _, reason, _ in parsed.rejected]
([[0.6, 0.8]], ['out_of_range'])
>>> sums = model.clipped_sum(parsed.rows)
>>> model.update({name: s / 1.0 for name, s in sums.items()}, rho=1.0)
>>> float(model.predict_proba(np.array([[0.6, 0.8]]))[0]) > 0.5
True
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

import numpy as np
from scipy.linalg import blas, solve_triangular
from scipy.special import expit
from scipy.stats import rankdata

from stream_vips.models import summaries
from stream_vips.models._validate import integer, positive
from stream_vips.models.base import Block, Model, ParsedBatch, group_clip_factors, group_gram_norms, group_sum
from stream_vips.models.fit_rule import WHY_Q, Settings, accountant_for, why_accountant
from stream_vips.models.synthetic import (
    Demo,
    SyntheticData,
    VectorData,
    check_dimension,
    check_weights,
    malformed_vectors,
)
from stream_vips.privacy.mechanisms import clip_factors, clip_rows, project_pd
from stream_vips.records import FieldBatch

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit

#: Below this |c| the Pólya-Gamma mean uses its Taylor series 1/4 - c^2/48 (error < c^4/480).
_PG_SERIES_BELOW = 1e-4
#: Eigenvalue floor without noise: only negative (rounding) eigenvalues are removed.
_MIN_FLOOR = float(np.finfo(float).tiny)
#: Triangular products for the E-step, by arithmetic precision.
_BLAS_TRMM = {"float64": blas.dtrmm, "float32": blas.strmm}
#: Rows per E-step block: a block's work buffer (2048 x d) stays in cache between its passes.
_E_STEP_ROWS = 2048
#: Largest |x_j| accepted before clipping (rejects absurd inputs rather than silently shrinking).
_MAX_ABS_INPUT = 1e6
#: What a step releases besides s2: the paper's s1 (``sums``) or the centred residual g.
RELEASES = ("sums", "centred")
#: Most updates a centred state may count (counts stay exact in float64).
_MAX_UPDATES = 2**53


def pg_mean(c: np.ndarray) -> np.ndarray:
    """E[omega] for omega ~ PG(1, c): tanh(c/2) / (2c), and 1/4 at c = 0 (even in c, <= 1/4).

    >>> pg_mean(np.array([0.0, 1e-8, 2.0])).round(6).tolist()
    [0.25, 0.25, 0.190399]
    """
    c = np.abs(np.asarray(c, dtype=float))
    small = c < _PG_SERIES_BELOW
    safe = np.where(small, 1.0, c)
    out = np.tanh(0.5 * safe) / (2.0 * safe)
    out = np.where(small, 0.25 - c * c / 48.0, out)
    return np.minimum(out, 0.25)


def joint_diameter(a1: float, a2: float) -> float:
    """Replace-one diameter of the joint (s1, s2) release for allocation weights (a1, a2).

    See the module docstring: D^2 = max(4 a1^2 + a2^2, 2 + a1^4 / (2 a2^2) if a1^2 < 2 a2^2),
    in units of the joint bound, with a1^2 + a2^2 = 1 (weights are normalised here).
    """
    a = np.array([a1, a2], dtype=float)
    if a.shape != (2,) or np.any(~(a > 0)) or not np.all(np.isfinite(a)):
        raise ValueError(f"allocation weights must be two positive numbers, got {a1!r}, {a2!r}")
    u1, u2 = (a / np.linalg.norm(a)) ** 2
    d2 = 4.0 * u1 + u2
    if u1 < 2.0 * u2:
        d2 = max(d2, 2.0 + u1 * u1 / (2.0 * u2))
    return float(min(2.0, math.sqrt(d2)))


class LogisticData(VectorData):
    """Logistic-regression records ``{"x": [...], "y": 0 | 1}`` from fixed weights.

    ``x = [f, bias]``: the last of the ``dimension`` features is the constant ``bias``, and the
    others are ``f ~ N(0, (x_scale^2 / (d - 1)) I)`` with ``f`` clipped to norm
    ``sqrt(1 - bias^2)``, so ``||x|| <= 1`` (the model's input bound, nothing is clipped again).
    ``y ~ Bernoulli(sigmoid(w . x))``. ``weights`` default to ``weight_scale * N(0, I)`` draws;
    with ``||x|| <= 1`` the logit is at most ``||w||``, so the weights must be large for the
    labels to carry signal. None of the malformed records is a valid logistic record (y = 0.5 is
    not a label).
    """

    def __init__(self, rng: np.random.Generator, dimension: int = 5, weights: Sequence[float] | None = None,
                 weight_scale: float = 4.0, x_scale: float = 0.8, bias: float = 0.5) -> None:
        self.dimension = check_dimension(dimension, 2, " (features and the bias)")
        if float(x_scale) <= 0 or float(weight_scale) <= 0:
            raise ValueError("x_scale and weight_scale must be > 0")
        if not 0.0 <= float(bias) < 1.0:
            raise ValueError(f"bias must be in [0, 1) so that ||x|| <= 1 leaves room for features, got {bias}")
        super().__init__(rng)
        if weights is None:
            self.weights = float(weight_scale) * rng.standard_normal(self.dimension)
        else:
            self.weights = check_weights(weights, self.dimension)
        self.x_scale, self.bias = float(x_scale), float(bias)
        self.malformed = malformed_vectors(self.dimension)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` fresh well-formed draws as arrays ``(X, y)`` (advances the generator)."""
        d = self.dimension
        f = self._rng.standard_normal((n, d - 1)) * (self.x_scale / np.sqrt(d - 1))
        norms = np.linalg.norm(f, axis=1, keepdims=True)
        room = np.sqrt(1.0 - self.bias**2) * (1.0 - 4 * np.finfo(float).eps)  # ||x|| <= 1 after rounding
        f *= np.minimum(1.0, room / np.maximum(norms, np.finfo(float).tiny))
        X = np.hstack([f, np.full((n, 1), self.bias)])
        y = (self._rng.random(n) < expit(X @ self.weights)).astype(np.int64)
        return X, y


def _demo_lines(s: Mapping[str, Any]) -> list[str]:
    return [f"held-out ROC AUC     {s['auc']:.4f} (private)",
            f"                     {s['non_private_auc']:.4f} (non-private, same records, "
            f"{s['non_private_updates']} updates)",
            f"                     {s['true_weights_auc']:.4f} (true weights; 0.5 is chance)"]


#: Audit candidates of the families on logistic records: unit x on the axes and at an angle, both labels.
AUDIT_RECORDS = tuple({"x": x, "y": y} for x in ([1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.6, 0.8]) for y in (0, 1))


class BayesianLogisticRegression(Model):
    """Bayesian logistic regression by VIPS with Pólya-Gamma augmentation (records ``{"x": [d
    numbers], "y": 0 | 1}``): each step releases the Pólya-Gamma statistics s1 = sum (y - 1/2) x
    and s2 = sum E[omega] x x^T of records clipped to norm 1 (or, with the centred release, the
    clipped residual g at the current iterate in place of s1), and the M-step forms the Gaussian
    posterior q(w) = N(mu, Sigma) under a Gamma hyperprior on the prior precision.

    Parameters (public configuration):

    - ``dim``: d, the length of a record's ``x`` (including any bias feature the producer adds);
    - ``dataset_size``: N of the M-step (the reservoir capacity; fit's N);
    - ``a0``, ``b0``: shape and rate of the Gamma hyperprior on the prior precision alpha;
    - ``floor_factor``: the public eigenvalue floor of the averaged noisy s2 is floor_factor * sqrt(d)
      * (noise std of one diagonal entry); the noise's spectral norm is about sqrt(2 d) times that
      std, and the default 1.0 sits a little below it (best on Adult, benchmarks/adult_logistic.py);
    - ``dtype``: the precision of the stored inputs and the E-step products: ``"float32"`` halves
      memory and roughly doubles E-step throughput (norms are inflated by their worst-case rounding
      before clipping; Pólya-Gamma means and the M-step stay in float64), ``"float64"`` keeps the
      rounding of the sums near 1e-16;
    - ``release``: the vector block, ``"sums"`` (s1, the paper's Algorithm 5) or ``"centred"`` (the
      clipped residual g at the current iterate, module docstring);
    - ``residual_clip``: C_r, the clip of the centred release's residual;
    - ``step_size``: the centred release's preconditioned step after the first, in (0, 1];
    - ``average_from``: the centred release's published mean averages the iterates after that many
      updates.
    """

    family: ClassVar[str] = "logistic"
    record_format: ClassVar[str] = '{"x": [d numbers], "y": 0 | 1}'
    synthetic: ClassVar[type[SyntheticData]] = LogisticData
    demo: ClassVar[Demo[BayesianLogisticRegression, LogisticData]] = Demo(
        about="Pólya-Gamma logistic regression (d = 5 with a bias feature): held-out ROC AUC, next to the "
              "AUC of the true weights",
        source={"dimension": 5},
        params=lambda data, seed: {"dim": data.dimension},
        held_out=lambda data: data.sample(20_000),
        score=lambda model, data, xy: {"auc": roc_auc(xy[1], model.predict_proba(xy[0]))},
        reference=lambda data, xy: {"true_weights_auc": roc_auc(xy[1], xy[0] @ data.weights),
                                    "true_weights": data.weights.tolist()},
        lines=_demo_lines)
    rejection_hints: ClassVar[Mapping[str, str]] = {
        "out_of_range": "logistic labels must be 0 or 1 (a -1/+1 label is out of range)"}

    def __init__(
        self,
        dim: int,
        dataset_size: int,
        a0: float = 1.0,
        b0: float = 1.0,
        floor_factor: float = 1.0,
        dtype: str = "float64",
        release: str = "sums",
        residual_clip: float = 0.5,
        step_size: float = 0.5,
        average_from: int = 0,
    ) -> None:
        self.dim = integer("dim", dim)
        self.dataset_size = integer("dataset_size", dataset_size)
        self.a0 = positive("a0", a0)
        self.b0 = positive("b0", b0)
        self.floor_factor = positive("floor_factor", floor_factor)
        if release not in RELEASES:
            raise ValueError(f"release must be one of {list(RELEASES)}, got {release!r}")
        self.release = release
        self.residual_clip = positive("residual_clip", residual_clip)
        self.step_size = positive("step_size", step_size)
        if self.step_size > 1.0:
            raise ValueError(f"step_size must be in (0, 1], got {step_size!r}")
        self.average_from = integer("average_from", average_from, minimum=0)
        if release == "sums" and (residual_clip, step_size, average_from) != (0.5, 0.5, 0):
            raise ValueError("residual_clip, step_size and average_from apply to release 'centred' only")
        if dtype not in _BLAS_TRMM:
            raise ValueError(f"dtype must be one of {sorted(_BLAS_TRMM)}, got {dtype!r}")
        self.dtype = np.dtype(dtype)
        self._trmm = _BLAS_TRMM[dtype]
        self._e_step_rows = _E_STEP_ROWS
        self._norm_inflation = 1.0 + self.dim * float(np.finfo(self.dtype).eps)
        self.s2_noise_std = 0.0
        self._alpha_shape, self._alpha_rate = self.a0, self.b0  # q(alpha) = prior before any data
        self._h = np.zeros(self.dim)  # blend of N s1
        self._S = np.zeros((self.dim, self.dim))  # blend of N s2 (noisy, not projected)
        self._A = self.alpha_mean  # blend of <alpha>
        self._noise_var = 0.0  # variance of the noise on one diagonal entry of S / N
        # centred release: the iterate m_t, the sum and number of averaged iterates, the updates so far
        self._iterate, self._mean_sum = np.zeros(self.dim), np.zeros(self.dim)
        self._averaged, self._updates = 0, 0
        self._weight = 0.0  # total weight of the blend S (1 - prod (1 - rho)): public, de-biases it
        self._refresh_posterior()

    # ------------------------------------------------------------------ fit
    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """The s1 release (:func:`logistic_sums_rule`), or the centred release (:func:`centred_logistic`)
        where N and d are large enough (:data:`CENTRED_MIN_N`, :data:`CENTRED_MIN_D`); non-private:
        :data:`NON_PRIVATE_LOGISTIC_STEPS` damped fixed-point steps."""
        settings = logistic_sums_rule(n, d, epsilon, delta, non_private)
        if non_private:
            return settings
        if centred_by_size(n, d):
            return centred_logistic(settings)
        why = {**settings.why, "release": (f"s1 (the paper's): N < {CENTRED_MIN_N} or d < {CENTRED_MIN_D}, where "
                                           "the centred release lost to it on the tuning sets (docs/fit.md)")}
        return dataclasses.replace(settings, why=why)

    @classmethod
    def fit_with(cls, settings: Settings, params: Mapping[str, Any], steps: int | None) -> Settings:
        """A private fit asking for a ``release`` gets that release's settings (the centred one
        with the caller's ``steps``, ``residual_clip``, ``step_size`` and ``average_from``)."""
        if settings.epsilon is None:
            return settings
        asked = params.get("release")
        n, d, epsilon, delta = settings.n, settings.d, settings.epsilon, settings.delta
        if asked == "centred" or (asked is None and settings.model_params.get("release") == "centred"):
            return centred_logistic(logistic_sums_rule(n, d, epsilon, delta, False), steps, params,
                                    asked=asked == "centred")
        if asked is not None:
            return logistic_sums_rule(n, d, epsilon, delta, False)
        return settings

    @classmethod
    def fit_complete(cls, settings: Settings, params: Mapping[str, Any]) -> Settings:
        """A centred release must average at least one iterate: ``average_from`` below the steps."""
        merged = {**settings.model_params, **params}
        average_from = merged.get("average_from", 0)
        if (merged.get("release") == "centred" and isinstance(average_from, int)
                and not isinstance(average_from, bool) and average_from >= settings.steps):
            raise ValueError(f"average_from = {average_from} is not below the {settings.steps} steps, so no iterate "
                             "would be averaged into the published mean (set a smaller one)")
        return settings

    @classmethod
    def audit(cls) -> FamilyAudit:
        """Unit x on the axes and at an angle, with both labels (:data:`AUDIT_RECORDS`): a label flip
        at the same x moves s1 by twice its bound and s2 not at all."""
        from stream_vips.models.auditing import FamilyAudit

        return FamilyAudit(
            "logistic", lambda capacity: BayesianLogisticRegression(dim=2, dataset_size=capacity), AUDIT_RECORDS,
            ratio_floor=0.96, floor_reason="a label flip leaves s2 unchanged; the pair reaches 0.97 of sqrt(3.4)",
            note="label flip at the same x moves s1 by ||x|| = 2 C1, s2 not at all; the engine "
                 "accounts the allocation-aware diameter sqrt(3.4) = 1.84 of its default weights, "
                 "which the pair reaches to 0.97")

    # ------------------------------------------------------------------ protocol: records
    def row_layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"x": (self.dtype, (self.dim,)), "y": (np.dtype(np.float64), ())}

    def parse_batch(self, objs: Sequence[Any]) -> ParsedBatch:
        """Check ``x`` (d finite numbers) and ``y`` (0 or 1); clip x to L2 norm 1."""
        batch = FieldBatch(objs)
        x = batch.vector("x", self.dim, max_abs=_MAX_ABS_INPUT)
        y = batch.binary("y", max_abs=_MAX_ABS_INPUT)
        ok = batch.accepted()
        return ParsedBatch(
            rows={"x": clip_rows(x[ok], 1.0).astype(self.dtype), "y": y[ok]},
            accepted=ok,
            rejected=batch.rejected(),
        )

    # ------------------------------------------------------------------ protocol: release
    @property
    def _first(self) -> str:
        """Name of the released vector block: ``s1``, or ``g`` for the centred release."""
        return "g" if self.release == "centred" else "s1"

    def blocks(self) -> tuple[Block, ...]:
        d = self.dim
        bound = self.residual_clip if self.release == "centred" else 0.5
        return (Block(self._first, (d,), bound), Block("s2", (d, d), 0.25, symmetric=True))

    def diameter(self, weights: Mapping[str, float] | None = None) -> float:
        """Joint replace-one diameter (module docstring) for the engine's allocation weights.

        ``weights`` maps block name to a_k (normalised here); for the default a_k proportional
        to C_k the diameter is sqrt(3.4). Without weights the allocation is unknown and the
        diameter that holds for every allocation, 2, is returned.
        """
        if weights is None:
            return 2.0
        return joint_diameter(*self._weight_pair(weights))

    def _weight_pair(self, weights: Mapping[str, float]) -> tuple[float, float]:
        if set(weights) != {self._first, "s2"}:
            raise ValueError(f"weights must name the blocks {self._first} and s2, got {sorted(weights)}")
        return float(weights[self._first]), float(weights["s2"])

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """E-step sums S1 = sum (y - 1/2) x (or G, the centred residual sum), S2 = sum E[omega] x x^T.

        Rows are re-clipped to norm 1 and labels mapped to {0, 1} (1 iff y > 1/2; NaN -> 0), both
        idempotent for parsed rows, so |y - 1/2| = 1/2 and the block bounds hold whatever the
        reservoir holds. S2 is accumulated block by block of rows (:meth:`_second_moment`).
        """
        X = np.asarray(batch["x"], dtype=self.dtype)
        y = (np.asarray(batch["y"], dtype=float) > 0.5).astype(float)
        if X.ndim != 2 or X.shape[1] != self.dim or y.shape != (X.shape[0],):
            raise ValueError(f"batch must hold x of shape (n, {self.dim}) and y of shape (n,), "
                             f"got {X.shape} and {y.shape}")
        # clip factors f_n folded into the products: the record's input is f_n x_n, c^2 is
        # quadratic in it, and S2 = sum omega_n (f_n x_n)(f_n x_n)^T. Norms are summed in the
        # working precision and inflated by its worst-case relative error d * eps, so the
        # clipped norm is <= 1 even in float32.
        norms = np.sqrt(np.einsum("ij,ij->i", X, X).astype(np.float64)) * self._norm_inflation
        f = clip_factors(norms, 1.0)
        s2, residual = self._second_moment(X, f, y - 0.5)
        s1 = (residual * f).astype(self.dtype) @ X
        return {self._first: s1.astype(np.float64), "s2": s2}

    def _residual(self, kappa: np.ndarray, omega: np.ndarray, xm: np.ndarray) -> np.ndarray:
        """Per-record coefficient of x in the released vector: y - 1/2, or for the centred release
        the clipped residual y - 1/2 - E[omega] x^T m (``xm`` = x^T m for the clipped input)."""
        if self.release != "centred":
            return kappa
        with np.errstate(invalid="ignore"):
            # E[omega] x^T m -> sign(x^T m) / 2 as |x^T m| -> inf (E[omega] c = tanh(c/2) / 2, c >= |x^T m|);
            # anything else that is not finite counts 0, so the clip below bounds every record
            pull = np.where(np.isfinite(xm), omega * xm, 0.5 * np.sign(xm))
        return np.clip(np.nan_to_num(kappa - pull, nan=0.0), -self.residual_clip, self.residual_clip)

    def _second_moment(self, X: np.ndarray, f: np.ndarray, kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """S2 = sum_n E[omega_n] f_n^2 x_n x_n^T with E[omega_n] = pg_mean(f_n c_n), in float64.

        Work goes by blocks of rows through one small buffer, so a block's passes run in cache
        and no n x d temporary is allocated: the buffer first holds (U x_n)^T for the block, so
        c^2 / f^2 = ||U x||^2 + (mu^T x)^2 (Sigma = U^T U, one in-place triangular product), then
        the weighted rows sqrt(E[omega_n]) f_n x_n, whose Gram matrix (numpy runs a symmetric
        rank-k update for a product with its own transpose) is added to the sum. Same arithmetic
        as one pass over the batch except the order of the final block sums. Also returns the
        per-record coefficients of the vector block (:meth:`_residual`).
        """
        n, d = X.shape
        total = np.zeros((d, d), dtype=self.dtype)
        residual = np.empty(n)
        rows = max(1, min(int(self._e_step_rows), n))
        work = np.empty((rows, d), dtype=self.dtype)
        for start in range(0, n, rows):
            block, fb = X[start:start + rows], f[start:start + rows]
            buf = work[: block.shape[0]]
            np.copyto(buf, block)
            UXt = self._trmm(1.0, self._sigma_factor, buf.T, side=0, lower=1, overwrite_b=1)
            xm = block @ self._mu_work
            c2 = np.einsum("ij,ij->j", UXt, UXt) + np.square(xm)
            omega = pg_mean(fb * np.sqrt(c2.astype(np.float64)))
            residual[start:start + rows] = self._residual(kappa[start:start + rows], omega, fb * xm)
            np.multiply(block, (fb * np.sqrt(omega)).astype(self.dtype)[:, None], out=buf)
            total += buf.T @ buf
        return total.astype(np.float64), residual

    # ------------------------------------------------------------------ privacy.unit: key
    supports_key_unit: ClassVar[bool] = True

    def group_clipped_sum(self, batch: Mapping[str, np.ndarray], groups: np.ndarray,
                          n_groups: int) -> dict[str, np.ndarray]:
        """Per-key E-step sums (S1_g or G_g, S2_g), each key scaled by one factor so that the vector
        block's norm is <= its bound and ||S2_g||_F <= 1/4, then added over keys (privacy rule 12).
        Records are clipped and labelled exactly as in :meth:`clipped_sum`; the work is in float64."""
        X = np.asarray(batch["x"], dtype=np.float64)
        y = (np.asarray(batch["y"], dtype=float) > 0.5).astype(float)
        if X.ndim != 2 or X.shape[1] != self.dim or y.shape != (X.shape[0],):
            raise ValueError(f"batch must hold x of shape (n, {self.dim}) and y of shape (n,), "
                             f"got {X.shape} and {y.shape}")
        g = np.asarray(groups, dtype=np.intp)
        f = clip_factors(np.sqrt(np.einsum("ij,ij->i", X, X)) * self._norm_inflation, 1.0)
        U = np.asarray(self._sigma_factor, dtype=np.float64)
        xm = X @ self._point
        UX = X @ U.T  # rows (U x_n)^T: c_n^2 / f_n^2 = ||U x_n||^2 + (m^T x_n)^2
        omega = pg_mean(f * np.sqrt(np.einsum("ij,ij->i", UX, UX) + np.square(xm)))
        W = X * (f * np.sqrt(omega))[:, None]  # S2_g = sum_n in g  w_n w_n^T
        s1_g = group_sum(X * (self._residual(y - 0.5, omega, f * xm) * f)[:, None], g, n_groups)
        bound = self.blocks()[0].bound
        factor = group_clip_factors([(np.linalg.norm(s1_g, axis=1), bound),
                                     (group_gram_norms(W, g, n_groups), 0.25)])
        Ww = W * np.sqrt(factor[g])[:, None]
        return {self._first: factor @ s1_g, "s2": Ww.T @ Ww}

    def group_diameter(self, weights: Mapping[str, float] | None = None) -> float:
        """Diameter of the key-level release: sqrt(4 a1^2 + 2 a2^2) (at most 2) for weights a_k.

        Block s1: two clipped key sums of norm <= C1 differ by <= 2 C1. Block s2: key sums are
        PSD (sums of PSD matrices scaled by a positive factor) with norm <= C2, and <A, A'>_F =
        tr(A A') >= 0 for PSD A, A', so ||A - A'||_F^2 <= 2 C2^2. Scaling block k by a_k / C_k
        (the engine's noise allocation) gives D^2 <= 4 a1^2 + 2 a2^2; the record-level coupling
        of s1 and s2 through one x (module docstring) is lost for a sum of records, so this is
        larger than :meth:`diameter` (sqrt(3.6) ~ 1.897 against sqrt(3.4) for the default weights).
        """
        if weights is None:
            return 2.0
        a = np.array(self._weight_pair(weights))
        if np.any(~(a > 0)) or not np.all(np.isfinite(a)):
            raise ValueError(f"allocation weights must be two positive numbers, got {a.tolist()}")
        u1, u2 = (a / np.linalg.norm(a)) ** 2
        return float(min(2.0, math.sqrt(4.0 * u1 + 2.0 * u2)))

    # ------------------------------------------------------------------ protocol: M-step
    def set_noise_scale(self, mean_stds: Mapping[str, float]) -> None:
        """Tell the model the public noise std on each entry of the released block means.

        For s2 this is the diagonal std (z C2 / a2 / normaliser), which sets the eigenvalue
        floor of the averaged statistic. Without it (or at zero, non-private) the projection only
        removes negative eigenvalues: the precision stays PD (>= A I) but noise is not damped.
        """
        std = float(mean_stds["s2"])
        if not (math.isfinite(std) and std >= 0):
            raise ValueError(f"s2 noise std must be finite and >= 0, got {std!r}")
        self.s2_noise_std = std

    @property
    def eigen_floor(self) -> float:
        """Public eigenvalue floor of the averaged s2 mean S / N (at least ``_MIN_FLOOR``)."""
        return max(self.floor_factor * math.sqrt(self.dim * self._noise_var), _MIN_FLOOR)

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        """Blend nu_t = [N s1, N s2 + <alpha> I] into nu with step rho (eqs. 51-55); for the centred
        release blend S and A, then move the iterate by a preconditioned step (module docstring)."""
        if not (0.0 < rho <= 1.0):
            raise ValueError(f"rho must be in (0, 1], got {rho!r}")
        d = self.dim
        s1 = np.asarray(noisy_mean[self._first], dtype=float)
        s2 = np.asarray(noisy_mean["s2"], dtype=float)
        if s1.shape != (d,) or s2.shape != (d, d):
            raise ValueError(f"noisy means must have shapes ({d},) and ({d}, {d}), got {s1.shape}, {s2.shape}")
        N = float(self.dataset_size)
        self._S = (1.0 - rho) * self._S + rho * (0.5 * N) * (s2 + s2.T)
        self._A = (1.0 - rho) * self._A + rho * self.alpha_mean
        self._noise_var = (1.0 - rho) ** 2 * self._noise_var + rho**2 * self.s2_noise_std**2
        if self.release == "centred":
            self._weight = (1.0 - rho) * self._weight + rho
            P = self._precision()
            lr = 1.0 if self._updates == 0 else self.step_size
            self._iterate = self._iterate + lr * np.linalg.solve(P, N * s1 - self._A * self._iterate)
            self._updates += 1
            if self._updates > self.average_from:
                self._mean_sum = self._mean_sum + self._iterate
                self._averaged += 1
            mean = self._mean_sum / self._averaged if self._averaged else self._iterate
            self._h = P @ mean
        else:
            self._h = (1.0 - rho) * self._h + rho * (N * s1)
        self._refresh_posterior()
        self._alpha_shape = self.a0 + 0.5 * d
        self._alpha_rate = self.b0 + 0.5 * (self.mu @ self.mu + np.trace(self.Sigma))

    def _precision(self) -> np.ndarray:
        """P = N proj(S / N) + A I. The centred release divides S by its blend weight w (so a
        schedule whose first rho is below 1 does not shrink the preconditioner and lengthen the
        steps by 1/rho), and the floor's noise variance by w^2."""
        N = float(self.dataset_size)
        w = self._weight if self.release == "centred" and self._weight > 0 else 1.0
        S, floor = self._S / (N * w), self.eigen_floor / w
        try:  # cheap test: all eigenvalues already >= floor, so the projection is the identity
            np.linalg.cholesky(S - floor * np.eye(self.dim))
        except np.linalg.LinAlgError:
            S = project_pd(S, floor)
        P = N * S
        P[np.diag_indices(self.dim)] += self._A
        return P

    def _refresh_posterior(self) -> None:
        """P (:meth:`_precision`), then Sigma = U^T U with U = R^-1 for P = R R^T, mu = Sigma h.
        The E-step linearises at mu, or at the iterate for the centred release."""
        self._P = self._precision()
        R = np.linalg.cholesky(self._P)
        U = solve_triangular(R, np.eye(self.dim), lower=True)
        self._sigma_factor = np.asfortranarray(U, dtype=self.dtype)
        self.Sigma = U.T @ U
        self.mu = U.T @ (U @ self._h)
        self._mu_work = self._point.astype(self.dtype)  # the E-step's mean in its precision, once per update

    @property
    def _point(self) -> np.ndarray:
        """The mean the E-step linearises at (float64): mu, or the iterate for the centred release."""
        return self._iterate if self.release == "centred" else self.mu

    @property
    def alpha_mean(self) -> float:
        """<alpha> under q(alpha) = Gamma(a_N, b_N)."""
        return self._alpha_shape / self._alpha_rate

    # ------------------------------------------------------------------ protocol: state
    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        d = integer("dim", hyperparameters["dim"])
        shapes: dict[str, tuple[int | None, ...]] = {"h": (d,), "precision": (d, d), "s2_blend": (d, d),
                                                     "alpha": (3,), "noise_var": (1,)}
        if hyperparameters.get("release", "sums") == "centred":
            shapes.update(iterate=(d,), mean_sum=(d,), counts=(3,))
        return shapes

    def state(self) -> dict[str, np.ndarray]:
        """Natural parameters of q(m): ``h`` = Sigma^-1 mu and the PD ``precision`` Sigma^-1 (what
        a reader needs); the blended statistics they derive from, ``s2_blend`` (S) and
        ``alpha`` = (a_N, b_N, A); and ``noise_var`` (public) for the eigenvalue floor. The centred
        release adds its ``iterate``, the ``mean_sum`` of the averaged iterates and ``counts`` =
        (updates, averaged iterates, blend weight of S)."""
        out = {
            "h": self._h.copy(),
            "precision": self._P.copy(),
            "s2_blend": self._S.copy(),
            "alpha": np.array([self._alpha_shape, self._alpha_rate, self._A]),
            "noise_var": np.array([self._noise_var]),
        }
        if self.release == "centred":
            out.update(iterate=self._iterate.copy(), mean_sum=self._mean_sum.copy(),
                       counts=np.array([self._updates, self._averaged, self._weight], dtype=float))
        return out

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore from :meth:`state`; the precision is recomputed from ``s2_blend`` and A."""
        shapes = self.state_shapes(self.hyperparameters())
        arrays = {}
        for name, shape in shapes.items():
            if name not in state:
                raise ValueError(f"state has no {name!r}")
            arrays[name] = np.array(state[name], dtype=float)
            if arrays[name].shape != shape:
                raise ValueError(f"state {name!r} must have shape {shape}, got {arrays[name].shape}")
            if not np.all(np.isfinite(arrays[name])):
                raise ValueError(f"state {name!r} must be finite")
        if not np.all(arrays["alpha"] > 0) or arrays["noise_var"][0] < 0:
            raise ValueError("state alpha parameters must be > 0 and noise_var >= 0")
        if not np.allclose(arrays["s2_blend"], arrays["s2_blend"].T):
            raise ValueError("state 's2_blend' must be symmetric")
        if "counts" in shapes:
            updates, averaged, weight = arrays["counts"]
            if not (0 <= averaged <= updates <= _MAX_UPDATES and updates == int(updates) and averaged == int(averaged)
                    and 0 <= weight <= 1 and (weight > 0) == (updates > 0)):
                raise ValueError("state 'counts' must be whole numbers 0 <= averaged <= updates <= 2^53 and a "
                                 "blend weight in (0, 1] once updated")
        saved = dict(vars(self))  # a refused state leaves the model as it was
        try:
            if "counts" in shapes:
                self._iterate, self._mean_sum = arrays["iterate"], arrays["mean_sum"]
                self._updates, self._averaged, self._weight = int(updates), int(averaged), float(weight)
            self._h, self._S = arrays["h"], arrays["s2_blend"]
            self._alpha_shape, self._alpha_rate, self._A = map(float, arrays["alpha"])
            self._noise_var = float(arrays["noise_var"][0])
            try:
                with np.errstate(over="ignore", invalid="ignore"):
                    self._refresh_posterior()
            except (ValueError, np.linalg.LinAlgError):
                raise ValueError("state does not give a finite, positive definite posterior") from None
            # |x^T m| <= ||m||_1 for ||x|| <= 1, so the E-step's c^2 >= (x^T m)^2 stays finite below this
            limit = math.sqrt(float(np.finfo(self.dtype).max)) / 2
            with np.errstate(over="ignore"):
                size = float(np.sum(np.abs(self._mu_work.astype(np.float64))))
            if not (size <= limit and np.all(np.isfinite(self.Sigma))):
                raise ValueError(f"state mean too large for the E-step in {self.dtype.name} "
                                 f"(sum of |m_j| above {limit:.3g})")
        except ValueError:
            vars(self).clear()
            vars(self).update(saved)
            raise

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "dataset_size": self.dataset_size,
            "a0": self.a0,
            "b0": self.b0,
            "floor_factor": self.floor_factor,
            "s2_noise_std": self.s2_noise_std,
            "dtype": self.dtype.name,
            **({"release": self.release, "residual_clip": self.residual_clip, "step_size": self.step_size,
                "average_from": self.average_from} if self.release == "centred" else {}),
        }

    # ------------------------------------------------------------------ prediction
    def summary(self) -> dict[str, Any]:
        """Posterior mean and marginal sd of each coefficient under q(w) = N(mu, Sigma), and the
        probit-approximation rule :meth:`predict_proba` follows, with its constants."""
        return summaries.coefficients(
            self.mu, self.Sigma,
            "p(y = 1 | x) = 1 / (1 + exp(-(mean . x) / sqrt(1 + probit_scale x' covariance x))), "
            "probit_scale = pi / 8, x clipped to L2 norm <= x_clip = 1",
            notes=("Polya-Gamma variational posterior q(w) = N(mu, Sigma)",),
            x_clip=1.0, probit_scale=summaries.PROBIT_SCALE)

    def prior_location(self) -> tuple[np.ndarray, np.ndarray]:
        """The prior w | alpha ~ N(0, alpha^-1 I) under alpha ~ Gamma(a0, rate b0): its marginal
        is a Student t with 2 a0 degrees of freedom, centre 0 and scale sqrt(b0 / a0), which
        :meth:`movement` uses as the prior sd (1 at the defaults a0 = b0 = 1)."""
        return np.zeros(self.dim), np.asarray(np.sqrt(self.b0 / self.a0))

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """P(y = 1 | x) by the probit approximation sigmoid(mu^T x / sqrt(1 + pi s^2 / 8)),
        s^2 = x^T Sigma x; inputs get the training preprocessing (clip to norm 1)."""
        X = clip_rows(np.atleast_2d(X), 1.0)
        if X.shape[1] != self.dim:
            raise ValueError(f"X must have {self.dim} columns, got {X.shape[1]}")
        s2 = np.einsum("ij,ij->i", X @ self.Sigma, X)
        return expit((X @ self.mu) / np.sqrt(1.0 + np.pi * s2 / 8.0))


def log_loss(y: np.ndarray, p: np.ndarray, eps: float = 1e-15) -> float:
    """Mean negative log-likelihood of labels ``y`` in {0, 1} under probabilities ``p``."""
    y = np.asarray(y, dtype=float)
    p = np.clip(np.asarray(p, dtype=float), eps, 1.0 - eps)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve: the Mann-Whitney probability that a positive outscores a
    negative, ties counting one half (average ranks)."""
    y = np.asarray(y).astype(bool)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("roc_auc needs both classes in y")
    ranks = rankdata(np.asarray(score, dtype=float))
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# ------------------------------------------------------------------------------ the fit rule

#: Logistic rule constants, chosen on synthetic data and public tuning sets (not the evaluated ones) by
#: benchmarks/fit_rule_evidence.py (docs/fit.md).
LOGISTIC_STEPS = 2
LOGISTIC_KAPPA = 1.0
LOGISTIC_WEIGHTS = {"s1": 1.0, "s2": 1.5}
#: Eigenvalue floor of the averaged noisy s2, in units of sqrt(d) * its diagonal noise std: 1, a
#: little below the spectral edge sqrt(2) of the symmetric noise (module docstring).
LOGISTIC_FLOOR_FACTOR = 1.0
class CentredDefaults(TypedDict):
    """The centred release's defaults: its steps, noise allocation, residual clip, step size and the
    share of the last iterates the mean averages."""

    steps: int
    weights: dict[str, float]
    residual_clip: float
    step_size: float
    averaged_share: float


#: The centred release (module docstring), with the settings of its best candidate in stage D of
#: benchmarks/fit_rule_evidence.py.
CENTRED_LOGISTIC: CentredDefaults = {"steps": 32, "weights": {"g": 1.0, "s2": 1.0}, "residual_clip": 0.5,
                                     "step_size": 0.5, "averaged_share": 0.75}
#: The rule takes the centred release when N >= this and d >= CENTRED_MIN_D: chosen on the tuning
#: sets and validated on 90 other public sets (benchmarks/fit_release_validation.py).
CENTRED_MIN_N = 1000
CENTRED_MIN_D = 6
#: Non-private logistic: enough damped fixed-point steps to converge (no noise to average).
NON_PRIVATE_LOGISTIC_STEPS = 30
NON_PRIVATE_KAPPA = 0.51


def logistic_rule_summary() -> dict[str, Any]:
    """The private logistic rule's s1 release (N < CENTRED_MIN_N or d < CENTRED_MIN_D), in the
    form benchmarks/fit_rule_evidence.py reports (its stages 0-C choose it)."""
    return {"q": 1.0, "steps": LOGISTIC_STEPS, "floor_factor": LOGISTIC_FLOOR_FACTOR,
            "s2_over_s1": LOGISTIC_WEIGHTS["s2"] / LOGISTIC_WEIGHTS["s1"], "kappa": LOGISTIC_KAPPA,
            "accountant": accountant_for(1.0), "release": "sums"}


def centred_by_size(n: int, d: int) -> bool:
    """Whether the rule takes the centred release for a private logistic fit of N records in d."""
    return n >= CENTRED_MIN_N and d >= CENTRED_MIN_D


_WHY_CENTRED_SIZE = (f"N >= {CENTRED_MIN_N} and d >= {CENTRED_MIN_D}: better than the s1 release there on the "
                     "tuning sets and on 90 other public sets, benchmarks/fit_release_validation.py")


def logistic_sums_rule(n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
    """Few uniformly averaged steps, s2-heavy weights, noise-aware floor (benchmarks/fit_rule_evidence.py)."""
    why = {"q": WHY_Q}
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
    why["accountant"] = why_accountant(1.0)
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
    chosen: dict[str, Any] = {"residual_clip": c["residual_clip"], "step_size": c["step_size"],
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
