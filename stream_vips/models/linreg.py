"""Conjugate Bayesian linear regression with a private streaming update.

Model: ``y = w^T x + e`` with ``e ~ N(0, 1/lam)`` and a Gaussian prior on ``w``. Two noise options:

- ``noise="known"``: ``lam`` is configured; prior ``w ~ N(m0, (alpha I)^-1)``. The posterior is
  Gaussian with natural parameters ``precision = alpha I + lam * sum x x^T`` and
  ``shift = alpha m0 + lam * sum x y`` (``shift = precision @ mean``).
- ``noise="gamma"``: Normal-Gamma prior ``lam ~ Gamma(a0, rate b0)``,
  ``w | lam ~ N(m0, (lam alpha I)^-1)``. Conjugate, so the posterior is Normal-Gamma with natural
  parameters ``precision = alpha I + sum x x^T``, ``shift = alpha m0 + sum x y``,
  ``quadratic = 2 b0 + alpha m0^T m0 + sum y^2`` and ``shape = a0 + N/2``; the rate is
  ``b = (quadratic - shift^T precision^-1 shift) / 2``. Being conjugate, it needs no mean-field
  factorisation: the natural-parameter update below is exact.

Records are ``{"x": [d numbers], "y": number}``. Preprocessing (public configuration, privacy
rule 5 in docs/privacy.md): values beyond ``max_abs`` are rejected as ``out_of_range`` and
NaN/infinity as ``non_finite``; then x is clipped to L2 norm ``x_bound`` = R and y to ``[-B, B]``.

Sensitivity. One record contributes ``(x x^T, x y, y^2)`` (the last only with ``noise="gamma"``).
After clipping, ``||x x^T||_F = ||x||^2 <= R^2``, ``||x y|| <= R B`` and ``|y^2| <= B^2``: these are
the block bounds C_k, and the joint bound is ``C = sqrt(R^4 + R^2 B^2 [+ B^4])``. The symmetric
block is released through Analyze-Gauss, whose vector (diagonal, sqrt(2) x upper triangle) has
the same norm as ``||x x^T||_F``, so its bound is unchanged. Under replace-one
adjacency the released sums move by ``||u - u'|| <= ||u|| + ||u'|| <= 2C`` (diameter 2, privacy
rule 2 in docs/privacy.md). Block by block less holds (``||x x^T - x' x'^T||_F^2 = ||x||^4 +
||x'||^4 - 2 (x^T x')^2 <= 2 R^4``; ``|y^2 - y'^2| <= B^2``), but the joint diameter in units of C
depends on how the engine allocates noise across blocks, so we keep the safe value 2. The count of
records is not released: the M-step scales by the configured dataset size N (the reservoir
capacity), a public constant (privacy rule 5 in docs/privacy.md).

Noise allocation (privacy rule 6 in docs/privacy.md). The blocks are one Gaussian mechanism; the
allocation weights a_k (sum a_k^2 = 1) only decide which block gets how much of the noise, std_k =
z C_k / a_k. The engine's generic default a_k proportional to C_k gives every block the same std
z C, so with ``y_bound`` B > ``x_bound`` R the scalar y^2 block takes most of the budget
(B^4 / (R^4 + R^2 B^2 + B^4): 76% for B = 2 R), though it does not enter the posterior mean at all.
:func:`default_block_weights` serves accuracy instead. To first order the mean w = P^-1 h moves by
P^-1 (dh - dP w) under noise dh, dP, so E||dw||^2 is proportional to std_xy^2 + std_xx^2 ||w||^2.
For a signal on the scale of the bounds (||w|| about B / R, |y| <= B for ||x|| <= R) that is
z^2 R^2 B^2 (1 / a_xy^2 + 1 / a_xx^2), smallest for a_xx = a_xy whatever R and B. The y^2 block
only sets the noise precision, one scalar next to the d coordinates of the mean: it gets the share
1 / (d + 1) of the budget (a_yy^2), and xx and xy split the rest equally.

M-step (stochastic natural-gradient VB, exact for this conjugate family): with noisy mean
statistics ``s_hat``, the target is ``eta_hat = eta_prior + N * s_hat`` (times ``lam`` for the known
precision), projected onto the feasible set (rate >= b0, which holds for every exact posterior),
and then ``eta <- (1 - rho) eta + rho eta_hat``. With no noise, the whole reservoir as batch and
rho = 1 this is the exact batch posterior over the reservoir.

Noise-aware eigenvalue floor (post-processing). The released ``xx`` mean carries symmetric
Analyze-Gauss noise E with diagonal std s (public: ``s = z R^2 / (a_xx * normaliser)``, which the
engine passes to :meth:`LinearRegression.set_noise_scale`) and off-diagonal std s / sqrt(2). E is
a Wigner matrix: its spectrum fills [-2 sqrt(d) s / sqrt(2), +2 sqrt(d) s / sqrt(2)], so its
spectral norm is about sqrt(2 d) s. An eigenvalue of the noisy ``xx`` below that edge cannot be
told apart from noise: in such a direction the noisy precision may be near zero (or negative)
while the noisy shift is not, and the mean P^-1 shift blows up there. The target's ``xx`` is
therefore projected (nearest matrix in Frobenius norm) onto eigenvalues >= ``floor_factor *
sqrt(d) * s`` before the prior is added; the default ``floor_factor`` sqrt(2) puts the floor at the
noise's spectral edge. Only public quantities enter, so this is post-processing; at s = 0
(non-private) the floor only removes negative rounding and the exact posterior is unchanged.

>>> import numpy as np
>>> m = LinearRegression(dim=2, dataset_size=4, y_bound=2.0)
>>> parsed = m.parse_batch([{"x": [3.0, 4.0], "y": 5.0}, {"x": [0.1, 0.2]}])
>>> parsed.rows["x"].round(2).tolist(), parsed.rows["y"].tolist(), parsed.rejected[0][1]
([[0.6, 0.8]], [2.0], 'missing_field')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from scipy import linalg, stats

from stream_vips.models import summaries
from stream_vips.models._validate import integer
from stream_vips.models.base import Block, Model, ParsedBatch, group_clip_factors, group_gram_norms, group_sum
from stream_vips.models.fit_rule import WHY_Q, Settings, accountant_for, why_accountant
from stream_vips.models.synthetic import (
    Demo,
    SyntheticData,
    check_dimension,
    check_weights,
    malformed_vectors,
    vector_lines,
)
from stream_vips.privacy.mechanisms import clip_rows, project_pd
from stream_vips.records import FieldBatch

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit

NOISE_OPTIONS = ("known", "gamma")
#: Default eigenvalue floor of the noisy ``xx`` in units of sqrt(d) * (its diagonal noise std):
#: sqrt(2) is the spectral edge of the symmetric (Wigner) noise (module docstring).
DEFAULT_FLOOR_FACTOR = math.sqrt(2.0)
#: ``fit``'s bound B on y (the rule's ``y_bound``), for targets standardised with public constants
#: (sd 1). Clipping y to [-B, B] shrinks the statistic x y by E[y clip(y)] / E[y^2], which for a
#: Gaussian target is exactly P(|y| < B): 0.68 at B = 1 (a third of every coefficient lost to
#: bias), 0.954 at 2, 0.997 at 3; and any standardised target keeps at least 1 - 1 / B^2 of its
#: mass unclipped (Chebyshev: 8/9 at 3). The noise on x y grows like B, so B is "a few sd": 3.
#: On synthetic standardised targets (d 5-10, N 2,000-20,000, epsilon 1) held-out RMSE at B = 2
#: and 3 was within 1% of each other and 1-8% below B = 1 (the model's own default, kept for
#: streams whose producers scale y to [-1, 1]).
RULE_Y_BOUND = 3.0
#: Floor without noise: only negative (rounding) eigenvalues are removed.
_MIN_FLOOR = float(np.finfo(float).tiny)


def default_block_weights(dim: int, x_bound: float = 1.0, y_bound: float = 1.0, *,
                          gamma: bool = False) -> dict[str, float]:
    """Noise allocation a_k (normalised, sum a_k^2 = 1) that serves the posterior mean (module
    docstring): a_xx = a_xy, and with ``gamma`` the y^2 block gets the budget share 1 / (d + 1).
    The bounds do not enter (the optimum a_xx = a_xy holds for every R and B); they are arguments
    so that the rule's inputs are explicit.

    >>> {k: round(v ** 2, 4) for k, v in default_block_weights(3, gamma=True).items()}
    {'xx': 0.375, 'xy': 0.375, 'yy': 0.25}
    >>> {k: round(v ** 2, 4) for k, v in default_block_weights(3, x_bound=1.0, y_bound=2.0).items()}
    {'xx': 0.5, 'xy': 0.5}
    """
    d = integer("linreg dim", dim)
    _positive("x_bound", x_bound), _positive("y_bound", y_bound)
    yy_share = 1.0 / (d + 1.0) if gamma else 0.0
    half = (1.0 - yy_share) / 2.0
    out = {"xx": float(np.sqrt(half)), "xy": float(np.sqrt(half))}
    if gamma:
        out["yy"] = float(np.sqrt(yy_share))
    return out


#: Why linreg's audit pairs stop at 0.75 of the claim (every linreg audit).
AUDIT_FLOOR = ("with a_xx = a_xy the mechanism's true diameter is 1.5 (x' at 60 degrees, y' = -y), "
               "0.75 of the allocation-free 2 the engine claims; no record pair does better")


def _positive(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"linreg {name} must be a positive number, got {value!r}") from None
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"linreg {name} must be a positive number, got {value!r}")
    return v


class RegressionData(SyntheticData):
    """``{"x": [x_1..x_d], "y": y}`` from a fixed linear model: ``x ~ N(0, (x_scale^2 / d) I)`` (so
    that ``E|x|^2 = x_scale^2``) and ``y = x . w + noise_std * e``, ``e ~ N(0, 1)``; ``weights``
    default to ``N(0, I)`` draws."""

    def __init__(self, rng: np.random.Generator, dimension: int = 5, weights: Sequence[float] | None = None,
                 noise_std: float = 0.1, x_scale: float = 0.5) -> None:
        self.dimension = check_dimension(dimension)
        if float(noise_std) < 0 or float(x_scale) <= 0:
            raise ValueError("noise_std must be >= 0 and x_scale > 0")
        super().__init__(rng)
        if weights is None:
            self.weights = rng.standard_normal(self.dimension)
        else:
            self.weights = check_weights(weights, self.dimension)
        self.noise_std = float(noise_std)
        self.x_scale = float(x_scale)
        self.malformed = malformed_vectors(self.dimension)

    def records(self, n: int) -> list[bytes]:
        x = self._rng.standard_normal((n, self.dimension)) * (self.x_scale / np.sqrt(self.dimension))
        y = x @ self.weights + self.noise_std * self._rng.standard_normal(n)
        return vector_lines(x, y.tolist())

    @property
    def model_params(self) -> dict[str, Any]:
        return {"dim": self.dimension}


def _demo_lines(s: Mapping[str, Any]) -> list[str]:
    return [f"model error          |E[w] - w_true| = {s['model_error']:.4f} (private)",
            f"                     |E[w] - w_true| = {s['non_private_model_error']:.4f} "
            f"(non-private, same records, {s['non_private_updates']} updates)"]


class LinearRegression(Model):
    """Conjugate Bayesian linear regression, y = w^T x + e, with Gaussian noise of known precision or
    a Normal-Gamma prior that learns it. One step releases the sums of x x^T, x y (and y^2 with the
    Gamma noise) over records clipped to public bounds; being conjugate, the posterior of the noisy
    statistics is exact, so a finite data set needs one release with the whole budget.

    Parameters (public configuration):

    - ``dim``: d, the length of a record's ``x``;
    - ``dataset_size``: N of the M-step (the reservoir capacity; fit's N);
    - ``noise``: ``"known"`` (precision ``noise_precision``) or ``"gamma"`` (a Gamma prior on it);
    - ``noise_precision``: the known noise precision lambda;
    - ``prior_precision``: alpha of the prior w ~ N(m0, (alpha I)^-1) (times lambda with the Gamma noise);
    - ``prior_mean``: m0 (``None``: zeros);
    - ``a0``, ``b0``: shape and rate of the Gamma prior on lambda (``noise="gamma"``);
    - ``x_bound``: R, the L2 norm x is clipped to;
    - ``y_bound``: B, y is clipped to [-B, B];
    - ``max_abs``: records with a value beyond it are rejected (``out_of_range``);
    - ``floor_factor``: the eigenvalue floor of the noisy x x^T mean, in units of sqrt(d) times its
      diagonal noise std (module docstring).
    """

    family: ClassVar[str] = "linreg"
    record_format: ClassVar[str] = '{"x": [d numbers], "y": number}'
    default_params: ClassVar[Mapping[str, Any]] = {"dim": 5}
    synthetic: ClassVar[type[SyntheticData]] = RegressionData
    demo: ClassVar[Demo[LinearRegression, RegressionData]] = Demo(
        about="linear regression (d = 5): |E[w] - w_true| against the true weights",
        source={"dimension": 5, "noise_std": 0.2, "x_scale": 0.8},
        params=lambda data, seed: {"dim": data.dimension, "noise_precision": 1.0 / data.noise_std**2,
                                   "x_bound": 1.0, "y_bound": 2.0},
        score=lambda model, data, _: {"model_error": float(np.linalg.norm(model.posterior_mean() - data.weights))},
        reference=lambda data, _: {"true_weights": data.weights.tolist()},
        lines=_demo_lines)

    def __init__(
        self,
        dim: int,
        dataset_size: int,
        *,
        noise: str = "known",
        noise_precision: float = 1.0,
        prior_precision: float = 1.0,
        prior_mean: Sequence[float] | None = None,
        a0: float = 1.0,
        b0: float = 1.0,
        x_bound: float = 1.0,
        y_bound: float = 1.0,
        max_abs: float = 1e6,
        floor_factor: float = DEFAULT_FLOOR_FACTOR,
    ) -> None:
        self.dim = integer("linreg dim", dim)
        self.dataset_size = integer("linreg dataset_size", dataset_size)
        if noise not in NOISE_OPTIONS:
            raise ValueError(f"linreg noise must be one of {NOISE_OPTIONS}, got {noise!r}")
        self.noise = noise
        self.noise_precision = _positive("noise_precision", noise_precision)
        self.prior_precision = _positive("prior_precision", prior_precision)
        self.a0 = _positive("a0", a0)
        self.b0 = _positive("b0", b0)
        self.x_bound = _positive("x_bound", x_bound)
        self.y_bound = _positive("y_bound", y_bound)
        self.max_abs = _positive("max_abs", max_abs)
        self.floor_factor = _positive("floor_factor", floor_factor)
        self.xx_noise_std = 0.0  # public noise std on a diagonal entry of the released xx mean
        m0 = np.zeros(self.dim) if prior_mean is None else np.asarray(prior_mean, dtype=float)
        if m0.shape != (self.dim,) or not np.all(np.isfinite(m0)):
            raise ValueError(f"linreg prior_mean must be {self.dim} finite numbers, got {prior_mean!r}")
        self.prior_mean = m0
        self._prior = self._prior_state()
        self._eta = {k: v.copy() for k, v in self._prior.items()}

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """One step with rho = 1 at q = 1. The family is conjugate: its statistics do not depend on
        the posterior, so T releases averaged are worth no more than one release with the whole
        budget, and one step gives the exact posterior of the noisy statistics. The noise is
        allocated by :func:`default_block_weights` (the family's default). y is clipped at
        +- :data:`RULE_Y_BOUND`, a few sds of a standardised target, and x to the model's
        ``x_bound`` (1)."""
        why = {"q": WHY_Q,
               "steps": ("1 step, rho = 1: conjugate, the statistics do not depend on the posterior, so one "
                         "release with the whole budget is the exact posterior of the noisy statistics"),
               "block_weights": ("linreg default allocation: equal shares for xx and xy (equal influence on the "
                                 "posterior mean), 1/(d + 1) of the budget for yy (noise precision only)"),
               "accountant": why_accountant(1.0),
               "y_bound": (f"y is clipped to [-{RULE_Y_BOUND:g}, {RULE_Y_BOUND:g}]: a standardised target (sd 1) keeps "
                           f"99.7% of a Gaussian's values and at least 8/9 of any distribution's unclipped, while "
                           "the noise on x y grows like the bound (pass y_bound for another public scale)"),
               "x_bound": "rows of x are clipped to L2 norm 1, the model's default (pass x_bound for another public "
                          "scale)"}
        return Settings("linreg", n, d, epsilon, delta, 1.0, 1, 1.0, 1.0, None, model_params={"y_bound": RULE_Y_BOUND},
                        why=why, accountant=accountant_for(1.0))

    @classmethod
    def fit_complete(cls, settings: Settings, params: Mapping[str, Any]) -> Settings:
        """A private fit that leaves the allocation to the family states it: :func:`default_block_weights`
        for the caller's ``noise``, ``x_bound`` and ``y_bound`` (checked here, before the model is built)."""
        if settings.block_weights is not None or settings.epsilon is None:
            return settings
        bounds = {"x_bound": 1.0, "y_bound": 1.0, **settings.model_params, **params}
        weights = default_block_weights(settings.d, bounds["x_bound"], bounds["y_bound"],
                                        gamma=params.get("noise", "known") == "gamma")
        return dataclasses.replace(settings, block_weights=weights)

    @classmethod
    def audit(cls) -> FamilyAudit:
        """Records at the bounds R = 1/4, B = 2 (and one at the origin): the worst pair is y' = -y
        with x' at 60 degrees to x (:data:`AUDIT_FLOOR`)."""
        from stream_vips.models.auditing import FamilyAudit

        return FamilyAudit(
            "linreg", lambda capacity: LinearRegression(dim=2, dataset_size=capacity, x_bound=0.25, y_bound=2.0),
            ({"x": [0.25, 0.0], "y": 2.0}, {"x": [0.25, 0.0], "y": -2.0}, {"x": [0.0, 0.25], "y": 2.0},
             {"x": [0.125, 0.2165], "y": -2.0}, {"x": [0.0, 0.0], "y": 0.0}),
            ratio_floor=0.74, floor_reason=AUDIT_FLOOR,
            note="y' = -y with x' at 60 degrees to x (x.x' = R^2/2): with the default weights "
                 "a_xx = a_xy = a the squared difference (noise units times z^2) is "
                 "a^2 (4 + 2t - 2t^2) at t = x.x'/R^2, largest at t = 1/2: diameter 1.5, 0.75 of the "
                 "claimed 2 (the engine keeps the allocation-free 2), so no pair reaches the claim")

    # -- configuration ---------------------------------------------------------------------

    @property
    def gamma(self) -> bool:
        return self.noise == "gamma"

    def prior_location(self) -> tuple[np.ndarray, np.ndarray]:
        """The prior of w: N(m0, alpha^-1 I) with known noise; with ``noise="gamma"``,
        w | lam ~ N(m0, (alpha lam)^-1 I) under lam ~ Gamma(a0, rate b0), whose marginal is a
        Student t with 2 a0 degrees of freedom, centre m0 and scale sqrt(b0 / (a0 alpha)), used
        as the prior sd by :meth:`movement`."""
        var = 1.0 / self.prior_precision
        if self.noise == "gamma":
            var *= self.b0 / self.a0
        return np.asarray(self.prior_mean, dtype=float), np.asarray(np.sqrt(var))

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "dataset_size": self.dataset_size,
            "noise": self.noise,
            "noise_precision": self.noise_precision,
            "prior_precision": self.prior_precision,
            "prior_mean": self.prior_mean.tolist(),
            "a0": self.a0,
            "b0": self.b0,
            "x_bound": self.x_bound,
            "y_bound": self.y_bound,
            "max_abs": self.max_abs,
            "floor_factor": self.floor_factor,
        }

    def _prior_state(self) -> dict[str, np.ndarray]:
        alpha, m0 = self.prior_precision, self.prior_mean
        eta = {"precision": alpha * np.eye(self.dim), "shift": alpha * m0}
        if self.gamma:
            eta["quadratic"] = np.array(2.0 * self.b0 + alpha * m0 @ m0)
            eta["shape"] = np.array(self.a0)
        return eta

    # -- records ---------------------------------------------------------------------------

    def row_layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"x": (np.dtype(np.float64), (self.dim,)), "y": (np.dtype(np.float64), ())}

    def parse_batch(self, objs: Sequence[Any]) -> ParsedBatch:
        batch = FieldBatch(objs)
        x = batch.vector("x", self.dim, max_abs=self.max_abs)
        y = batch.scalar("y", max_abs=self.max_abs)
        ok = batch.accepted()
        rows = {"x": clip_rows(x[ok], self.x_bound), "y": np.clip(y[ok], -self.y_bound, self.y_bound)}
        return ParsedBatch(rows=rows, accepted=ok, rejected=batch.rejected())

    # -- behind the privacy wall -----------------------------------------------------------

    def blocks(self) -> tuple[Block, ...]:
        d, R, B = self.dim, self.x_bound, self.y_bound
        out: tuple[Block, ...] = (Block("xx", (d, d), R * R, symmetric=True), Block("xy", (d,), R * B))
        if self.gamma:
            out += (Block("yy", (), B * B),)
        return out

    def default_block_weights(self) -> dict[str, float]:
        """This model's accuracy-serving noise allocation (:func:`default_block_weights`)."""
        return default_block_weights(self.dim, self.x_bound, self.y_bound, gamma=self.gamma)

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Rows are clipped at parse time; clipping again here keeps the bound local to the wall
        # (idempotent on clipped rows) whatever the batch's provenance.
        X = clip_rows(np.asarray(batch["x"], dtype=float).reshape(-1, self.dim), self.x_bound)
        y = np.clip(np.asarray(batch["y"], dtype=float).reshape(-1), -self.y_bound, self.y_bound)
        out = {"xx": X.T @ X, "xy": X.T @ y}
        if self.gamma:
            out["yy"] = np.array(y @ y)
        return out

    supports_key_unit: ClassVar[bool] = True

    def group_clipped_sum(self, batch: Mapping[str, np.ndarray], groups: np.ndarray,
                          n_groups: int) -> dict[str, np.ndarray]:
        """Per-key sums of (x x^T, x y[, y^2]) scaled by one factor per key so that each block is
        within its bound (R^2, R B[, B^2]); the batch sum adds them (privacy rule 12). Every key
        sum of x x^T is PSD, so the Gram norms come from :func:`group_gram_norms`."""
        X = clip_rows(np.asarray(batch["x"], dtype=float).reshape(-1, self.dim), self.x_bound)
        y = np.clip(np.asarray(batch["y"], dtype=float).reshape(-1), -self.y_bound, self.y_bound)
        g = np.asarray(groups, dtype=np.intp)
        R, B = self.x_bound, self.y_bound
        xy = group_sum(X * y[:, None], g, n_groups)
        parts = [(group_gram_norms(X, g, n_groups), R * R), (np.linalg.norm(xy, axis=1), R * B)]
        if self.gamma:
            yy = np.bincount(g, weights=y * y, minlength=n_groups).astype(float)
            parts.append((yy, B * B))
        factor = group_clip_factors(parts)
        Xw = X * np.sqrt(factor[g])[:, None]
        out = {"xx": Xw.T @ Xw, "xy": factor @ xy}
        if self.gamma:
            out["yy"] = np.array(factor @ yy)
        return out

    # -- M-step on privatized statistics ---------------------------------------------------

    def set_noise_scale(self, mean_stds: Mapping[str, float]) -> None:
        """Learn the public noise std on a diagonal entry of the released ``xx`` mean (the
        engine passes z R^2 / (a_xx * normaliser)); it sets the eigenvalue floor of ``xx``."""
        std = float(mean_stds["xx"])
        if not (np.isfinite(std) and std >= 0):
            raise ValueError(f"linreg xx noise std must be finite and >= 0, got {std!r}")
        self.xx_noise_std = std

    @property
    def eigen_floor(self) -> float:
        """Public floor on the eigenvalues of the noisy ``xx`` mean: floor_factor sqrt(d) s."""
        return max(self.floor_factor * math.sqrt(self.dim) * self.xx_noise_std, _MIN_FLOOR)

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        if not (0.0 < rho <= 1.0):
            raise ValueError(f"step size rho must be in (0, 1], got {rho!r}")
        stats_ = {}
        for block in self.blocks():
            if block.name not in noisy_mean:
                raise ValueError(f"linreg update is missing statistic {block.name!r}")
            arr = np.asarray(noisy_mean[block.name], dtype=float)
            if arr.shape != block.shape or not np.all(np.isfinite(arr)):
                raise ValueError(f"linreg statistic {block.name!r} must be finite with shape {block.shape}")
            stats_[block.name] = arr
        target = self._target(stats_)
        for k, v in target.items():
            self._eta[k] = (1.0 - rho) * self._eta[k] + rho * v

    def _target(self, s: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """eta_prior + N * proj(s) (scaled by lam when known): ``xx`` projected onto eigenvalues
        >= :attr:`eigen_floor`, the quadratic onto rate >= b0."""
        n = self.dataset_size * (1.0 if self.gamma else self.noise_precision)
        xx = (s["xx"] + s["xx"].T) / 2.0
        floor = self.eigen_floor
        try:  # all eigenvalues already >= floor: the projection is the identity (exact when noiseless)
            np.linalg.cholesky(xx - floor * np.eye(self.dim))
        except np.linalg.LinAlgError:
            xx = project_pd(xx, floor)
        precision = self._prior["precision"] + n * xx
        shift = self._prior["shift"] + n * s["xy"]
        target = {"precision": precision, "shift": shift}
        if self.gamma:
            quad = float(self._prior["quadratic"]) + self.dataset_size * float(s["yy"])
            floor = float(shift @ linalg.solve(precision, shift, assume_a="pos")) + 2.0 * self.b0
            target["quadratic"] = np.array(max(quad, floor))
            target["shape"] = np.array(self.a0 + self.dataset_size / 2.0)
        return target

    # -- natural parameters ----------------------------------------------------------------

    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        d = integer("dim", hyperparameters["dim"])
        gamma = {"quadratic": (), "shape": ()} if hyperparameters["noise"] == "gamma" else {}
        return {"precision": (d, d), "shift": (d,), **gamma}

    def state(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._eta.items()}

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        if set(state) != set(self._prior):
            raise ValueError(f"linreg state must have {sorted(self._prior)}, got {sorted(state)}")
        new = {}
        for k, ref in self._prior.items():
            arr = np.asarray(state[k], dtype=float)
            if arr.shape != ref.shape or not np.all(np.isfinite(arr)):
                raise ValueError(f"linreg state {k!r} must be finite with shape {ref.shape}")
            new[k] = arr.copy()
        self._eta = new

    # -- read side -------------------------------------------------------------------------

    def _cho(self) -> tuple[np.ndarray, bool]:
        return linalg.cho_factor(self._eta["precision"])

    def posterior_mean(self) -> np.ndarray:
        """E[w] = precision^-1 shift."""
        return linalg.cho_solve(self._cho(), self._eta["shift"])

    def summary(self) -> dict[str, Any]:
        """Posterior mean and marginal sd of each coefficient (Student-t under the Gamma noise: its sd
        where finite) and the predictive rule with its constants (post-processing of the state)."""
        scale = np.linalg.inv(self._eta["precision"])
        rule_x = f"x clipped to L2 norm <= x_clip = {self.x_bound:g}"
        if not self.gamma:
            return summaries.coefficients(
                self.posterior_mean(), scale,
                f"y ~ Normal(mean . x, noise_variance + x' covariance x), {rule_x}",
                notes=(f"known noise precision {self.noise_precision:g}",),
                x_clip=self.x_bound, noise_variance=1.0 / self.noise_precision)
        a = float(np.asarray(self._eta["shape"]).reshape(-1)[0])
        b = self.noise_rate()
        out = summaries.coefficients(
            self.posterior_mean(), scale,
            "y ~ Student-t(df 2 noise_shape, location mean . x, squared scale (noise_rate / noise_shape) "
            f"(1 + x' scale_matrix x)), {rule_x}", matrix="scale_matrix",
            notes=(f"noise precision ~ Gamma(a={a:.4g}, b={b:.4g}), mean {a / b:.4g}; coefficients are "
                   "Student-t, sd shown where finite",),
            x_clip=self.x_bound, noise_shape=a, noise_rate=b)
        cov = scale * (b / a * (a / (a - 1.0) if a > 1.0 else math.inf))
        out["sd"] = np.sqrt(np.clip(np.diag(cov), 0, None)).tolist()
        return out

    def noise_rate(self) -> float:
        """Posterior rate b of the noise precision (``noise="gamma"`` only)."""
        if not self.gamma:
            raise ValueError("noise_rate needs noise='gamma'")
        h = self._eta["shift"]
        return 0.5 * float(self._eta["quadratic"] - h @ self.posterior_mean())

    def _predictive_parts(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Location, squared scale and degrees of freedom of the predictive at clipped rows."""
        X = clip_rows(np.atleast_2d(np.asarray(X, dtype=float)), self.x_bound)
        if X.shape[1] != self.dim:
            raise ValueError(f"predictive inputs must have {self.dim} columns, got {X.shape[1]}")
        cho = self._cho()
        mean = X @ linalg.cho_solve(cho, self._eta["shift"])
        quad = np.einsum("ij,ji->i", X, linalg.cho_solve(cho, X.T))
        if not self.gamma:
            return mean, 1.0 / self.noise_precision + quad, np.inf
        a = float(self._eta["shape"])
        return mean, self.noise_rate() / a * (1.0 + quad), 2.0 * a

    def predictive(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior predictive mean and variance of y at the rows of ``X`` (clipped like records).

        Known precision: Gaussian with variance ``1/lam + x^T precision^-1 x``. Normal-Gamma:
        Student-t with ``2a`` degrees of freedom and squared scale ``(b/a)(1 + x^T precision^-1 x)``,
        whose variance is that times ``2a / (2a - 2)`` (infinite when ``a <= 1``).
        """
        mean, scale2, dof = self._predictive_parts(X)
        if np.isinf(dof):
            return mean, scale2
        var = scale2 * dof / (dof - 2.0) if dof > 2.0 else np.full_like(scale2, np.inf)
        return mean, var

    def predictive_logpdf(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Exact log predictive density of ``y`` at the rows of ``X`` (Gaussian or Student-t)."""
        mean, scale2, dof = self._predictive_parts(X)
        y = np.asarray(y, dtype=float)
        if np.isinf(dof):
            return stats.norm.logpdf(y, loc=mean, scale=np.sqrt(scale2))
        return stats.t.logpdf(y, df=dof, loc=mean, scale=np.sqrt(scale2))
