"""SEP for the conjugate Gaussian mean model: x ~ N(mu, noise_var I), mu ~ N(m0, prior_var I).

The tilted distribution q_cav(mu) N(x_n; mu, noise_var I) is Gaussian, so moment matching is
exact and the local site is the likelihood term itself, theta_fn = (x_n / noise_var,
I / noise_var), whatever the cavity. SEP's fixed point is then theta_f = mean_n theta_fn and
theta_q = theta_0 + N theta_f is the exact posterior: the reference case that checks the SEP
machinery of :mod:`stream_vips.models.sep.core`.

>>> m = GaussianMeanSEP(dim=2, dataset_size=4, clip=None, noise_var=1.0)
>>> batch = m.parse_batch([{"x": [1.0, 2.0]}, {"x": [3.0, 2.0]}, {"x": [1.0, 2.0]}, {"x": [3.0, 2.0]}])
>>> m.update({"site": m.clipped_sum(batch.rows)["site"] / 4}, rho=1.0)
>>> m.posterior()[0].round(3).tolist()   # (0 + 4 * mean x) / (1 + 4)
[[1.6, 1.6]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from stream_vips.models._validate import positive
from stream_vips.models.sep.core import SEPModel


class GaussianMeanSEP(SEPModel):
    """(DP-)SEP posterior over the mean of an isotropic Gaussian with known variance."""

    family: ClassVar[str] = "sep_gaussian"

    def __init__(
        self,
        *,
        dim: int,
        dataset_size: int,
        clip: float | None,
        noise_var: float = 1.0,
        damping: float = 1.0,
        prior_mean: float | Sequence[float] = 0.0,
        prior_var: float = 1.0,
        precision_floor: float | None = None,
        floor_factor: float = 1.0,
        x_clip: float | None = None,
        max_abs: float = 1e6,
    ) -> None:
        super().__init__(
            n_factors=1, dim=dim, dataset_size=dataset_size, clip=clip, damping=damping,
            prior_mean=prior_mean, prior_var=prior_var, precision_floor=precision_floor,
            floor_factor=floor_factor, x_clip=x_clip, max_abs=max_abs,
        )
        self.noise_var = positive("noise_var", noise_var)

    def local_sites(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The likelihood terms (x / noise_var, I / noise_var), shapes (B, 1, d), (B, 1, d, d)."""
        x = np.asarray(batch["x"], dtype=float)
        eta = x[:, None, :] / self.noise_var
        prec = np.broadcast_to(np.eye(self.dim) / self.noise_var, (len(x), 1, self.dim, self.dim))
        return eta, prec

    def log_predictive(self, X: np.ndarray) -> np.ndarray:
        """log N(x; mean, cov + noise_var I) under the posterior, per row of X."""
        mean, cov = self.posterior()
        S = cov[0] + self.noise_var * np.eye(self.dim)
        L = np.linalg.cholesky(S)
        r = np.linalg.solve(L, (np.atleast_2d(X) - mean[0]).T)
        logdet = 2.0 * np.log(np.diag(L)).sum()
        return -0.5 * (np.sum(r * r, axis=0) + logdet + self.dim * np.log(2 * np.pi))

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "dim": self.dim, "noise_var": self.noise_var, **super().hyperparameters(),
        }
