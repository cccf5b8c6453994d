"""DP-SEP Bayesian probit regression: p(y = 1 | x, w) = Phi(x^T w), w ~ N(m0, prior_var I).

Moment matching is closed form (Minka 2001; Rasmussen & Williams 2006, section 3.6). With the
cavity N(w; m, V), a record (x, y) and t = 2y - 1, the tilted distribution N(w; m, V) Phi(t x^T w)
depends on w only through a = x^T w, whose cavity marginal is N(mu, s2) with mu = x^T m,
s2 = x^T V x. With z = t mu / sqrt(1 + s2) and r = phi(z) / Phi(z):

    Z    = Phi(z)
    E[a] = mu + t s2 r / sqrt(1 + s2)
    V[a] = s2 - s2^2 beta,   beta = r (z + r) / (1 + s2)

(:func:`tilted_moments`). Dividing the projected marginal by the cavity marginal gives a rank-one
site in w, theta_fn = (nu x, tau x x^T) with

    tau = beta / (1 - s2 beta),   nu = (alpha + mu beta) / (1 - s2 beta),   alpha = t r / sqrt(1 + s2)

(:func:`site_coefficients`); 0 < r (z + r) < 1 makes s2 beta < 1 and tau >= 0. The packed site
norm is sqrt(nu^2 ||x||^2 + tau^2 ||x||^4), so the clipped batch sum is
(X^T (c nu), X^T diag(c tau) X) with per-record clip factors c: no per-record d x d array.

>>> m = ProbitSEP(dim=2, dataset_size=100, clip=5.0, intercept=False)
>>> batch = m.parse_batch([{"x": [1.0, 0.0], "y": 1}, {"x": [0.0, 1.0], "y": 0}, {"x": [1.0], "y": 1}])
>>> batch.accepted.tolist(), [r[1] for r in batch.rejected]
([0, 1], ['wrong_shape'])
>>> m.update({"site": m.clipped_sum(batch.rows)["site"] / 2}, rho=1.0)
>>> p = m.predict_proba(np.array([[1.0, 0.0], [0.0, 1.0]]))
>>> bool(p[0] > 0.5 > p[1])
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from scipy.special import log_ndtr, ndtr

from stream_vips.models import summaries
from stream_vips.models._validate import integer
from stream_vips.models.base import ParsedBatch
from stream_vips.models.fit_rule import Settings, settings_from_rule
from stream_vips.models.sep.core import RULE_CLIP, SITE, SEPModel, pack, parse_vectors, site_rule
from stream_vips.models.synthetic import (
    SyntheticData,
    VectorData,
    check_dimension,
    check_weights,
    malformed_vectors,
)
from stream_vips.privacy.mechanisms import clip_factors

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit

_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


def _ratio(z: np.ndarray) -> np.ndarray:
    """phi(z) / Phi(z), computed in log space (stable for very negative z)."""
    return np.exp(-0.5 * z * z - _LOG_SQRT_2PI - log_ndtr(z))


def tilted_moments(mu: np.ndarray, s2: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normaliser, mean and variance of N(a; mu, s2) Phi(t a), for t in {-1, +1}."""
    mu, s2, t = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (mu, s2, t)))
    root = np.sqrt(1.0 + s2)
    z = t * mu / root
    r = _ratio(z)
    beta = r * (z + r) / (1.0 + s2)
    return ndtr(z), mu + t * s2 * r / root, s2 - s2 * s2 * beta


def site_coefficients(mu: np.ndarray, s2: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nu, tau) of the site N-ratio proj[tilted] / cavity in the direction a = x^T w."""
    root = np.sqrt(1.0 + s2)
    z = t * mu / root
    r = _ratio(z)
    beta = r * (z + r) / (1.0 + s2)
    denom = 1.0 - s2 * beta
    return (t * r / root + mu * beta) / denom, beta / denom


class ProbitData(VectorData):
    """Probit records ``{"x": [d numbers], "y": 0 | 1}``: ``x ~ N(0, I)`` in ``dimension`` features
    and ``y ~ Bernoulli(Phi(w . x + bias))``; ``weights`` default to ``N(0, I)`` draws. None of the
    malformed records is a valid probit record (y = 0.5 is not a label)."""

    def __init__(self, rng: np.random.Generator, dimension: int = 3, weights: Sequence[float] | None = None,
                 bias: float = 0.0) -> None:
        self.dimension = check_dimension(dimension)
        super().__init__(rng)
        if weights is None:
            self.weights = rng.standard_normal(self.dimension)
        else:
            self.weights = check_weights(weights, self.dimension)
        self.bias = float(bias)
        self.malformed = malformed_vectors(self.dimension)

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` fresh well-formed draws as arrays ``(X, y)`` (advances the generator)."""
        X = self._rng.standard_normal((n, self.dimension))
        y = (self._rng.random(n) < ndtr(X @ self.weights + self.bias)).astype(np.int64)
        return X, y


class ProbitSEP(SEPModel):
    """DP-SEP probit classification (records ``{"x": [d numbers], "y": 0 | 1}``): a Gaussian
    posterior over the weights of p(y = 1 | x, w) = Phi(x^T w), learnt by stochastic expectation
    propagation with closed-form rank-one sites, clipped behind the privacy wall.

    Parameters (public configuration; the others are the SEP core's):

    - ``dim``: d, the length of a record's ``x`` (including any bias feature the producer adds);
    - ``intercept``: append a constant 1 after clipping x to ``x_clip``, so the weights have
      d + 1 entries (default false: like ``logistic``, ``dpvi`` and ``sgld``, records carry their
      own bias column when they want one, and a second constant would duplicate it);
    - ``clip``: C, the L2 bound on every site (default 1, the fit rule's and the DP-SEP paper's
      choice; ``None``: plain SEP, non-private only). The site's norm is
      sqrt(nu^2 ||x||^2 + tau^2 ||x||^4): at the prior's cavity N(0, I) a record with ||x|| = 1 and
      x^T m = 0 has nu = 0.83, tau = 0.47, norm 0.95; records the cavity explains have smaller sites
      (0.44 at t x^T m = 2) and contradicted ones larger (1.10 at -2), and the norm grows like
      ||x||^2. So at inputs of unit scale C = 1 leaves the typical record's site whole and bounds
      what one surprising or large record can pull.
    """

    family: ClassVar[str] = "sep_probit"
    record_format: ClassVar[str] = '{"x": [d numbers], "y": 0 | 1}'
    synthetic: ClassVar[type[SyntheticData]] = ProbitData

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """The SEP families' schedule and clip as they are (:func:`~stream_vips.models.sep.core.site_rule`):
        the probit site is closed-form and its posterior one Gaussian, so nothing family-specific
        is chosen; the intercept (none: records carry their bias column) and the prior keep their
        defaults."""
        return settings_from_rule(cls.family, n, d, epsilon, delta, non_private,
                                  site_rule(n, d, None if non_private else epsilon, delta, {}, {}))

    def __init__(
        self,
        *,
        dim: int,
        dataset_size: int,
        clip: float | None = RULE_CLIP,
        intercept: bool = False,
        damping: float = 1.0,
        prior_var: float = 1.0,
        precision_floor: float | None = None,
        floor_factor: float = 1.0,
        x_clip: float | None = None,
        max_abs: float = 1e6,
    ) -> None:
        if not isinstance(intercept, bool):
            raise ValueError(f"intercept must be true or false, got {intercept!r}")
        self.n_features = int(dim)
        self.intercept = intercept
        super().__init__(
            n_factors=1, dim=int(dim) + int(intercept), dataset_size=dataset_size, clip=clip,
            damping=damping, prior_mean=0.0, prior_var=prior_var, precision_floor=precision_floor,
            floor_factor=floor_factor, x_clip=x_clip, max_abs=max_abs,
        )

    @classmethod
    def audit(cls) -> FamilyAudit:
        """Label flips at x in {-1, 0, 1} under a wide prior, both sites clipped to C = 0.1."""
        from stream_vips.models.auditing import FamilyAudit

        return FamilyAudit(
            "sep_probit",
            lambda capacity: ProbitSEP(dim=1, dataset_size=capacity, clip=0.1, x_clip=1.0, prior_var=100.0,
                                       intercept=True),
            tuple({"x": [v], "y": y} for v in (-1.0, 0.0, 1.0) for y in (0, 1)),
            ratio_floor=0.99, floor_reason="a label flip keeps the site's precision part, here 1/12 of its eta",
            note="a label flip negates the site's eta but not its precision part tau; at x = 0 (the "
                 "intercept alone) with the wide prior (variance 100) the cavity variance makes "
                 "eta / tau about 12, and clip 0.1 holds both sites at C: 0.997 of 2C (0.84 at "
                 "prior variance 1, clip 1)")

    def row_layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"x": (np.dtype(np.float64), (self.dim,)), "y": (np.dtype(np.int8), ())}

    def features(self, X: np.ndarray) -> np.ndarray:
        """Rows of raw features -> model inputs (clipped to x_clip, intercept appended)."""
        X = np.atleast_2d(np.asarray(X, dtype=float))
        if X.shape[1] != self.n_features:
            raise ValueError(f"expected {self.n_features} features, got {X.shape[1]}")
        if self.x_clip is not None:
            X = X * clip_factors(np.linalg.norm(X, axis=1), self.x_clip)[:, None]
        return np.hstack([X, np.ones((len(X), 1))]) if self.intercept else X

    def parse_batch(self, objs: Sequence[Any]) -> ParsedBatch:
        """``{"x": [dim numbers], "y": 0 | 1}``; other labels are rejected as out of range."""
        fields, x = parse_vectors(objs, self.n_features, None, self.max_abs)
        y = fields.binary("y")
        ok = fields.accepted()
        return ParsedBatch(
            rows={"x": self.features(x[ok]), "y": y[ok].astype(np.int8)},
            accepted=ok,
            rejected=fields.rejected(),
        )

    def _coefficients(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        X = np.asarray(batch["x"], dtype=float)
        t = 2.0 * np.asarray(batch["y"], dtype=float) - 1.0
        eta, prec = self.cavity()
        V = np.linalg.inv(prec[0])
        m = V @ eta[0]
        XV = X @ V
        nu, tau = site_coefficients(X @ m, np.einsum("ij,ij->i", XV, X), t)
        return X, nu, tau

    def local_sites(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Dense per-record sites (nu x, tau x x^T), for inspection; the hot path stays rank one."""
        X, nu, tau = self._coefficients(batch)
        return (nu[:, None] * X)[:, None, :], (tau[:, None, None] * X[:, :, None] * X[:, None, :])[:, None]

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """(X^T (c nu), X^T diag(c tau) X) packed, c = per-record clip factors (behind the wall)."""
        X, nu, tau = self._coefficients(batch)
        if self.clip is not None and len(X):
            sq = np.einsum("ij,ij->i", X, X)
            c = clip_factors(np.sqrt(nu * nu * sq + tau * tau * sq * sq), self.clip)
            nu, tau = c * nu, c * tau
        eta = X.T @ nu
        prec = (X * tau[:, None]).T @ X
        return {SITE: pack(eta[None], prec[None])}

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Posterior predictive p(y = 1 | x) = Phi(x^T m / sqrt(1 + x^T V x)) for raw feature rows."""
        F = self.features(X)
        mean, cov = self.posterior()
        s2 = np.einsum("ij,jk,ik->i", F, cov[0], F)
        return ndtr(F @ mean[0] / np.sqrt(1.0 + s2))

    def summary(self) -> dict[str, Any]:
        """Posterior mean and marginal sd of each coefficient (the intercept last) and the rule
        :meth:`predict_proba` follows."""
        mean, cov = self.posterior()
        clip = "clipped to L2 norm <= x_clip (when set)"
        return summaries.coefficients(
            mean[0], cov[0], "p(y = 1 | x) = Phi((mean . f) / sqrt(1 + f' covariance f)), Phi the standard "
            f"normal cdf, f = x {clip}" + (" with 1 appended (the intercept)" if self.intercept else ""),
            x_clip=self.x_clip, intercept=self.intercept)

    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        d = integer("dim", hyperparameters["dim"]) + (hyperparameters["intercept"] is True)
        return {"eta": (1, d), "prec": (1, d, d)}

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "dim": self.n_features, "intercept": self.intercept, **super().hyperparameters(),
        }
