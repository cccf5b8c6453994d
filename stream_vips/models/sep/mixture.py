"""DP-SEP clustering: a mixture of J Gaussians with unknown means (DP-SEP paper, section 6.1).

Model (after Li et al. 2015): mu_j ~ N(m0, prior_var I), h_n ~ Uniform{1..J},
x_n | h_n ~ N(mu_{h_n}, noise_sd^2 I), with the covariance and the weights known. The posterior
is approximated by prod_j N(mu_j; m_j, V_j) (full covariances).

Moment matching. With the cavity prod_j N(mu_j; c_j, C_j), the tilted distribution of a record x
is the mixture over j of "component j absorbed x" (a conjugate update of mu_j) with weights

    r_j ∝ N(x; c_j, C_j + noise_sd^2 I)                         (responsibilities)

and the other components at their cavity. Its marginal for mu_j is r_j N(P_j) + (1 - r_j) N(C_j),
with P_j = (C_j^-1 + I / noise_sd^2)^-1 and the absorbed mean c_j + delta_j,
delta_j = P_j (x - c_j) / noise_sd^2, so the projected moments are

    mean_j = c_j + r_j delta_j
    cov_j  = r_j P_j + (1 - r_j) C_j + r_j (1 - r_j) delta_j delta_j^T

and the local site is (cov_j^-1 mean_j, cov_j^-1) minus the cavity's natural parameters. All of
it is vectorized over the batch and the components ((B, J, d, d) arrays; d is small here).

Components start apart: the initial posterior means are drawn from the prior with the public
``init_seed`` (data-independent), at the prior precision.

>>> m = MixtureSEP(n_components=2, dim=1, dataset_size=4, clip=None, prior_var=4.0, init_seed=1)
>>> batch = m.parse_batch([{"x": [-2.0]}, {"x": [-2.1]}, {"x": [2.0]}, {"x": [2.1]}])
>>> for rho in (1.0, 0.5, 0.5, 0.5):
...     m.update({"site": m.clipped_sum(batch.rows)["site"] / 4}, rho)
>>> sorted(m.posterior()[0].ravel().round(1).tolist())
[-2.0, 2.0]
>>> m.responsibilities(np.array([[-2.0], [2.0]])).round(2).max(axis=1).tolist()
[1.0, 1.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from scipy.special import softmax

from stream_vips.models import summaries
from stream_vips.models._validate import integer, positive
from stream_vips.models.fit_rule import Settings, settings_from_rule
from stream_vips.models.sep.core import SEPModel, site_rule
from stream_vips.models.synthetic import SyntheticData, check_dimension, malformed_vectors

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit


class MixtureData(SyntheticData):
    """Points ``{"x": [d numbers]}`` from a mixture of ``n_components`` isotropic Gaussians of
    standard deviation ``noise_sd`` with equal weights; the means (:attr:`means`, K x d) are
    ``N(0, spread^2 I)`` draws."""

    def __init__(self, rng: np.random.Generator, n_components: int = 3, dimension: int = 2, spread: float = 2.0,
                 noise_sd: float = 0.5) -> None:
        self.dimension = check_dimension(dimension)
        if int(n_components) < 1:
            raise ValueError(f"n_components must be >= 1, got {n_components}")
        if not (float(spread) > 0 and float(noise_sd) > 0):
            raise ValueError("spread and noise_sd must be > 0")
        super().__init__(rng)
        self.n_components, self.noise_sd = int(n_components), float(noise_sd)
        self.means = float(spread) * rng.standard_normal((self.n_components, self.dimension))
        self.malformed = malformed_vectors(self.dimension)

    def sample(self, n: int) -> np.ndarray:
        """``n`` fresh points (n, d) (advances the generator)."""
        h = self._rng.integers(self.n_components, size=n)
        return self.means[h] + self.noise_sd * self._rng.standard_normal((n, self.dimension))

    def records(self, n: int) -> list[bytes]:
        return [b'{"x": [%s]}' % ", ".join(map(repr, row)).encode() for row in self.sample(n).tolist()]

    @property
    def model_params(self) -> dict[str, Any]:
        return {"dim": self.dimension}


#: Components the fit rule gives when the caller names none (the number of clusters is the caller's choice).
RULE_COMPONENTS = 3


class MixtureSEP(SEPModel):
    """DP-SEP clustering: the posterior over the means of a mixture of Gaussians with known isotropic
    covariance and equal weights, one full-covariance Gaussian factor per component, learnt by
    stochastic expectation propagation whose clipped local sites are the released statistic.

    Parameters (public configuration; the others are the SEP core's):

    - ``n_components``: K, the mixture's components;
    - ``dim``: d, the length of a record's ``x``;
    - ``noise_sd``: the known standard deviation of every component, in the data's units;
    - ``init_seed``: the public draw of the initial component means from the prior.
    """

    family: ClassVar[str] = "sep_mixture"
    record_format: ClassVar[str] = '{"x": [d numbers]}'
    synthetic: ClassVar[type[SyntheticData]] = MixtureData

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """The SEP families' schedule and clip as they are (:func:`~stream_vips.models.sep.core.site_rule`)
        with :data:`RULE_COMPONENTS` components; the noise sd and the prior keep their defaults (their
        scale is the data's, which the rule may not read)."""
        why = {"n_components": (f"K = {RULE_COMPONENTS}: a default so that the rule runs; the number of clusters is "
                                "the caller's modelling choice (--param n_components), not a public quantity"),
               "noise_sd": "the model's default 0.5: the clusters' spread is in the data's units, which the rule "
                           "may not read (--param noise_sd, prior_var for the data's scale)"}
        return settings_from_rule(cls.family, n, d, epsilon, delta, non_private,
                                  site_rule(n, d, None if non_private else epsilon, delta,
                                            {"n_components": RULE_COMPONENTS}, why))

    def __init__(
        self,
        *,
        n_components: int,
        dim: int,
        dataset_size: int,
        clip: float | None,
        noise_sd: float = 0.5,
        damping: float = 1.0,
        prior_mean: float | Sequence[float] = 0.0,
        prior_var: float = 1.0,
        precision_floor: float | None = None,
        floor_factor: float = 1.0,
        init_seed: int = 0,
        x_clip: float | None = None,
        max_abs: float = 1e6,
    ) -> None:
        super().__init__(
            n_factors=n_components, dim=dim, dataset_size=dataset_size, clip=clip, damping=damping,
            prior_mean=prior_mean, prior_var=prior_var, precision_floor=precision_floor,
            floor_factor=floor_factor, x_clip=x_clip, max_abs=max_abs,
        )
        self.noise_sd = positive("noise_sd", noise_sd)
        self.init_seed = integer("init_seed", init_seed, minimum=0)
        K, d = self.n_factors, self.dim
        draws = np.random.default_rng(self.init_seed).standard_normal((K, d))
        start = self.prior_mean + np.sqrt(self.prior_var) * draws
        self._set_posterior(start / self.prior_var, np.broadcast_to(np.eye(d) / self.prior_var, (K, d, d)))

    @classmethod
    def audit(cls) -> FamilyAudit:
        """Points across the line, every site clipped to C = 1/4."""
        from stream_vips.models.auditing import FamilyAudit

        return FamilyAudit(
            "sep_mixture",
            lambda capacity: MixtureSEP(n_components=2, dim=1, dataset_size=capacity, clip=0.25, init_seed=0),
            tuple({"x": [v]} for v in (-8.0, -3.0, -1.0, 0.0, 1.0, 3.0, 8.0)),
            ratio_floor=0.98, floor_reason="the two sites share part of their precision direction; best 0.988",
            note="clip 0.25 clips every site to C; sites of different points share part of their "
                 "precision part, so ||u - u'|| stays just under 2C (0.94 at clip 1)")

    def _log_evidence(self, X: np.ndarray, means: np.ndarray, covs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """log N(x; mean_j, cov_j + noise_sd^2 I) (B, J) and the differences x - mean_j (B, J, d)."""
        S = covs + self.noise_sd**2 * np.eye(self.dim)
        diff = X[:, None, :] - means[None]
        maha = np.einsum("bjd,jde,bje->bj", diff, np.linalg.inv(S), diff)
        logdet = np.linalg.slogdet(S)[1]
        return -0.5 * (maha + logdet + self.dim * np.log(2.0 * np.pi)), diff

    def local_sites(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per-record, per-component sites proj[tilted] - cavity: (B, J, d), (B, J, d, d)."""
        X = np.asarray(batch["x"], dtype=float)
        eta_c, prec_c = self.cavity()
        C = np.linalg.inv(prec_c)
        c = np.einsum("jde,je->jd", C, eta_c)
        P = np.linalg.inv(prec_c + np.eye(self.dim) / self.noise_sd**2)
        log_ev, diff = self._log_evidence(X, c, C)
        r = softmax(log_ev, axis=1)[..., None]
        delta = np.einsum("jde,bje->bjd", P, diff) / self.noise_sd**2
        mean = c + r * delta
        rr = r[..., None]
        cov = rr * P + (1.0 - rr) * C + rr * (1.0 - rr) * delta[..., :, None] * delta[..., None, :]
        prec = np.linalg.inv(cov)
        prec = 0.5 * (prec + np.swapaxes(prec, -1, -2))
        return np.einsum("bjde,bje->bjd", prec, mean) - eta_c, prec - prec_c

    def responsibilities(self, X: np.ndarray) -> np.ndarray:
        """p(h = j | x) under the posterior predictive N(x; m_j, V_j + noise_sd^2 I), rows of X."""
        means, covs = self.posterior()
        return softmax(self._log_evidence(np.atleast_2d(np.asarray(X, dtype=float)), means, covs)[0], axis=1)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Most probable component per row of X."""
        return self.responsibilities(X).argmax(axis=1)

    def summary(self) -> dict[str, Any]:
        """The (equal, fixed) weights, the posterior means and covariances of the component means,
        the noise sd, and the rule :meth:`responsibilities` follows."""
        means, covs = self.posterior()
        K = self.n_factors
        out: dict[str, Any] = {
            "kind": "mixture",
            "predictive": "p(component j | x) = weights[j] N(x; means[j], covariances[j] + noise_sd^2 I) / "
                          "sum_k weights[k] N(x; means[k], covariances[k] + noise_sd^2 I); the prediction "
                          "is the most probable j",
            "noise_sd": self.noise_sd, "weights": [1.0 / K] * K, "means": means.tolist(),
            "notes": ["the weights are equal and fixed: the model learns the component means only"],
        }
        if self.dim <= summaries.MATRIX_LIMIT:
            out["covariances"] = covs.tolist()
        else:
            out["notes"].append(f"covariances omitted (d = {self.dim} > {summaries.MATRIX_LIMIT}): invert the "
                                "natural parameter prec")
        return out

    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        k, d = integer("n_components", hyperparameters["n_components"]), integer("dim", hyperparameters["dim"])
        return {"eta": (k, d), "prec": (k, d, d)}

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "n_components": self.n_factors, "dim": self.dim, "noise_sd": self.noise_sd,
            "init_seed": self.init_seed, **super().hyperparameters(),
        }
