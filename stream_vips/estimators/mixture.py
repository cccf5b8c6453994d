"""Private clustering by a DP-SEP mixture of Gaussians (the ``sep_mixture`` family)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.base import ClusterMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from stream_vips.estimators._base import PrivateEstimator


class PrivateGaussianMixture(ClusterMixin, PrivateEstimator):
    """A mixture of ``n_components`` Gaussians with diagonal spreads and weights, with
    (epsilon, delta)-differential privacy: the posterior over the component means, learnt by DP-SEP
    (one full-covariance Gaussian factor per component), and each component's spreads and weight
    from privately released responsibility-weighted statistics in the same steps.

    - ``epsilon``, ``delta``: the budget one ``fit`` spends (cross-validation spends it per fit);
    - ``n_components``: K (default 3, the fit rule's);
    - ``noise_sd``: the prior guess of every component's sd in the data's units (a public modelling
      choice; default 0.5, suited to standardised data); with ``learn_spreads=False`` the known sd;
    - ``learn_spreads``: learn spreads and weights (true), or take the known sd ``noise_sd`` and
      equal weights, the means alone learnt (false); ``None``: the fit rule's (true below 8
      features, false from 8, where learnt spreads lost the clusters privately on synthetic data);
    - ``spread_bound``: b, the bound each squared residual coordinate is clipped to (as b^2; default
      2, for standardised data);
    - ``prior_var``: the variance of the isotropic prior of every mean (default 1: standardised
      data);
    - ``clip``: C, the public L2 bound on every site (``None``: the fit rule's, 1);
    - ``x_bound``: the L2 bound rows of X are clipped to (``None``: none; the sites' clip bounds
      the sensitivity either way);
    - ``mean_covariance``: each component mean's posterior factor, ``"full"``, ``"diag"`` or
      ``"spherical"`` (``None``: the fit rule's: full below 8 features, spherical from 8);
    - ``spreads``: ``"diag"`` (a variance per coordinate) or ``"spherical"`` (one per component;
      ``None``: the fit rule's);
    - ``steps``, ``non_private``, ``random_state``: as in
      :class:`~stream_vips.estimators.PrivateLogisticRegression`.

    ``labels_`` are the training rows' clusters: computed from the rows themselves, they are not
    covered by the guarantee (for the data's holder, not for publication); ``means_`` and
    everything :meth:`predict` gives on other rows are.

    >>> import numpy as np
    >>> from stream_vips.estimators import PrivateGaussianMixture
    >>> rng = np.random.default_rng(0)
    >>> centres = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
    >>> X = centres[rng.integers(0, 3, 3000)] + 0.5 * rng.normal(size=(3000, 2))
    >>> gm = PrivateGaussianMixture(epsilon=1.0, random_state=0).fit(X)
    >>> gm.predict_proba(X[:2]).shape, gm.means_.shape
    ((2, 3), (3, 2))
    """

    family: ClassVar[str] = "sep_mixture"
    bound_params: ClassVar[tuple[str, ...]] = ("clip", "x_clip", "spread_bound")

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-5, n_components: int = 3, noise_sd: float = 0.5,
                 learn_spreads: bool | None = None, spread_bound: float = 2.0, prior_var: float = 1.0,
                 clip: float | None = None, x_bound: float | None = None,
                 mean_covariance: str | None = None, spreads: str | None = None,
                 steps: int | None = None, non_private: bool = False, random_state: Any = None) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.n_components = n_components
        self.noise_sd = noise_sd
        self.learn_spreads = learn_spreads
        self.spread_bound = spread_bound
        self.prior_var = prior_var
        self.clip = clip
        self.x_bound = x_bound
        self.mean_covariance = mean_covariance
        self.spreads = spreads
        self.steps = steps
        self.non_private = non_private
        self.random_state = random_state

    def _model_params(self, n_features: int) -> dict[str, Any]:
        params: dict[str, Any] = {"n_components": self.n_components, "noise_sd": self.noise_sd,
                                  "spread_bound": self.spread_bound, "prior_var": self.prior_var,
                                  "x_clip": self.x_bound}
        if self.random_state is not None:
            params["init_seed"] = int(check_random_state(self.random_state).randint(0, 2**31 - 1))
        if self.clip is not None:
            params["clip"] = self.clip
        for name in ("learn_spreads", "mean_covariance", "spreads"):
            if getattr(self, name) is not None:
                params[name] = getattr(self, name)
        return params

    def fit(self, X: Any, y: Any = None) -> PrivateGaussianMixture:
        """Fit privately to the rows of X, spending the whole budget once (``y`` is ignored)."""
        X = self._validate(X, reset=True)
        self._fit_private(X, None)
        self.labels_ = self.predict(X)
        return self

    @property
    def means_(self) -> np.ndarray:
        """The posterior means of the component means, shape (K, d)."""
        return np.asarray(self.model_.posterior()[0], dtype=float)

    @property
    def weights_(self) -> np.ndarray:
        """The mixture weights, shape (K,) (uniform with known spreads)."""
        check_is_fitted(self, "posterior_")
        return np.asarray(self.model_.weights(), dtype=float)

    @property
    def covariances_(self) -> np.ndarray:
        """Each component's diagonal spread (variances), shape (K, d), as scikit-learn's "diag"."""
        check_is_fitted(self, "posterior_")
        return np.asarray(self.model_.variances(), dtype=float)

    def predict_proba(self, X: Any) -> np.ndarray:
        """p(component | x) under the posterior predictive, shape (n, K)."""
        check_is_fitted(self, "posterior_")
        return np.asarray(self.model_.responsibilities(self._validate(X, reset=False)), dtype=float)

    def predict(self, X: Any) -> np.ndarray:
        """The most probable component of each row."""
        return self.predict_proba(X).argmax(axis=1).astype(np.int64)

    def sample_posterior(self, n: int, random_state: Any = None) -> np.ndarray:
        """``n`` draws of the K component means from their Gaussian posteriors, shape (n, K, d)."""
        means, covs = self.model_.posterior()
        rng = check_random_state(random_state)
        L = np.linalg.cholesky(covs)
        z = rng.standard_normal((int(n), *means.shape))
        return means[None] + np.einsum("kij,nkj->nki", L, z)
