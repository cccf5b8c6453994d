"""A private sigmoid belief network (the ``sbn`` family) as a scikit-learn transformer."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from stream_vips.estimators._base import PrivateEstimator


class PrivateSigmoidBeliefNetwork(ClassNamePrefixFeaturesOutMixin, TransformerMixin, PrivateEstimator):
    """A sigmoid belief network with (epsilon, delta)-differential privacy (Pólya-Gamma VIPS):
    ``n_components`` binary latent units explain binary features through sigmoid links.
    ``transform`` gives q(z_k = 1 | x), each row's latent code; :meth:`reconstruct_proba` the
    probability of every feature through it (a density model's denoising).

    - ``epsilon``, ``delta``: the budget one ``fit`` spends (cross-validation spends it per fit);
    - ``n_components``: K, the latent units (``None``: the fit rule's 50);
    - ``binarize``: the threshold X is binarised at (as BernoulliNB's; ``None``: X must already
      hold 0 and 1, other values are rejected as records, ``out_of_range``);
    - ``clip_units``, ``clip_omega``, ``clip_pixels``: the public clipping fractions of the
      family's blocks (``None``: the fit rule's, chosen on synthetic networks, docs/sbn.md);
    - ``steps``, ``non_private``, ``random_state``: as in
      :class:`~stream_vips.estimators.PrivateLogisticRegression`.

    >>> import numpy as np
    >>> from stream_vips.estimators import PrivateSigmoidBeliefNetwork
    >>> rng = np.random.default_rng(0)
    >>> X = (rng.random((1000, 8)) < 0.3).astype(float)
    >>> sbn = PrivateSigmoidBeliefNetwork(epsilon=1.0, n_components=3, random_state=0).fit(X)
    >>> sbn.transform(X[:2]).shape, sbn.reconstruct_proba(X[:2]).shape
    ((2, 3), (2, 8))
    """

    family: ClassVar[str] = "sbn"
    bound_params: ClassVar[tuple[str, ...]] = ("clip_units", "clip_omega", "clip_pixels")

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-5, n_components: int | None = None,
                 binarize: float | None = 0.5, clip_units: float | None = None, clip_omega: float | None = None,
                 clip_pixels: float | None = None, steps: int | None = None, non_private: bool = False,
                 random_state: Any = None) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.n_components = n_components
        self.binarize = binarize
        self.clip_units = clip_units
        self.clip_omega = clip_omega
        self.clip_pixels = clip_pixels
        self.steps = steps
        self.non_private = non_private
        self.random_state = random_state

    def _model_params(self, n_features: int) -> dict[str, Any]:
        params: dict[str, Any] = {k: v for k, v in (("n_latent", self.n_components), ("clip_units", self.clip_units),
                                                    ("clip_omega", self.clip_omega),
                                                    ("clip_pixels", self.clip_pixels)) if v is not None}
        return params

    def _bits(self, X: Any, reset: bool) -> np.ndarray:
        X = self._validate(X, reset=reset)
        return X if self.binarize is None else (X > float(self.binarize)).astype(np.float64)

    def fit(self, X: Any, y: Any = None) -> PrivateSigmoidBeliefNetwork:
        """Fit privately to the rows of X, spending the whole budget once (``y`` is ignored)."""
        self._fit_private(self._bits(X, reset=True), None)
        self._n_features_out = int(self.model_.n_latent)
        return self

    def _from_message(self, message: Any) -> None:
        self.n_features_in_ = int(message["hyperparameters"]["n_visible"])
        self._n_features_out = int(message["hyperparameters"]["n_latent"])

    def transform(self, X: Any) -> np.ndarray:
        """q(z_k = 1 | x) for every row and latent unit, shape (n, K)."""
        check_is_fitted(self, "posterior_")
        return np.asarray(self.model_.posterior_z(self._bits(X, reset=False)), dtype=float)

    def reconstruct_proba(self, X: Any) -> np.ndarray:
        """p(x_j = 1) of each row's reconstruction through q(z | x), shape (n, d)."""
        check_is_fitted(self, "posterior_")
        return np.asarray(self.model_.reconstruct_proba(self._bits(X, reset=False)), dtype=float)
