"""A private Bayesian neural network by DP-SEP (the ``sep_bnn`` family) as a scikit-learn regressor."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from stream_vips.estimators._base import PrivateEstimator


class PrivateBNNRegressor(RegressorMixin, PrivateEstimator):
    """A one-hidden-layer Bayesian neural network (ReLU units, probabilistic backpropagation's
    moment matching) with (epsilon, delta)-differential privacy by DP-SEP: a factorised Gaussian
    over every weight and a Gamma over the noise precision.

    - ``epsilon``, ``delta``: the budget one ``fit`` spends (cross-validation spends it per fit);
    - ``x_mean``, ``x_std``, ``y_mean``, ``y_std``: the public standardisation of X and y (numbers;
      default 0 and 1: pass standardised data, or the known scale of each, never statistics of
      the data being fitted);
    - ``input_clip``: standardised inputs and targets are clipped to [-input_clip, input_clip]
      (default 10 standard deviations);
    - ``clip``: C, the public L2 bound on every site (``None``: the fit rule's, 1);
    - ``hidden``: the hidden units (``None``: the fit rule's);
    - ``steps``, ``non_private``, ``random_state``: as in
      :class:`~stream_vips.estimators.PrivateLogisticRegression`.

    >>> import numpy as np
    >>> from stream_vips.estimators import PrivateBNNRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(2000, 1))
    >>> y = np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=2000)
    >>> reg = PrivateBNNRegressor(epsilon=1.0, random_state=0).fit(X, y)
    >>> mean, std = reg.predict(X[:3], return_std=True)
    >>> mean.shape, bool(np.all(std > 0))
    ((3,), True)
    """

    family: ClassVar[str] = "sep_bnn"
    bound_params: ClassVar[tuple[str, ...]] = ("clip", "input_clip")

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-5, x_mean: float = 0.0, x_std: float = 1.0,
                 y_mean: float = 0.0, y_std: float = 1.0, input_clip: float = 10.0, clip: float | None = None,
                 hidden: int | None = None, steps: int | None = None, non_private: bool = False,
                 random_state: Any = None) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.x_mean = x_mean
        self.x_std = x_std
        self.y_mean = y_mean
        self.y_std = y_std
        self.input_clip = input_clip
        self.clip = clip
        self.hidden = hidden
        self.steps = steps
        self.non_private = non_private
        self.random_state = random_state

    def _model_params(self, n_features: int) -> dict[str, Any]:
        params: dict[str, Any] = {"x_mean": self.x_mean, "x_std": self.x_std, "y_mean": self.y_mean,
                                  "y_std": self.y_std, "input_clip": self.input_clip}
        if self.random_state is not None:
            params["init_seed"] = int(check_random_state(self.random_state).randint(0, 2**31 - 1))
        return {**params, **{k: v for k, v in (("clip", self.clip), ("hidden", self.hidden)) if v is not None}}

    def fit(self, X: Any, y: Any) -> PrivateBNNRegressor:
        """Fit privately to (X, y), spending the whole budget once."""
        X, y = self._validate_xy(X, y, y_numeric=True)
        return self._fit_private(X, y)

    def predict(self, X: Any, return_std: bool = False) -> Any:
        """The predictive mean of y at each row (and its standard deviation, noise included, with
        ``return_std=True``), in y's original units."""
        check_is_fitted(self, "posterior_")
        X = self._validate(X, reset=False)
        mean, var = self.model_.predict(X)
        return (mean, np.sqrt(var)) if return_std else mean

    def sample_posterior(self, n: int, random_state: Any = None) -> np.ndarray:
        """``n`` draws of the network's weights from the factorised posterior, shape (n, W)."""
        mean, var, _, _ = self.model_.posterior()
        rng = check_random_state(random_state)
        return mean + np.sqrt(var) * rng.standard_normal((int(n), len(mean)))
