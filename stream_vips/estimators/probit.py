"""Private probit classification by DP-SEP (the ``sep_probit`` family) as a scikit-learn classifier."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from sklearn.base import ClassifierMixin

from stream_vips.estimators._linear import BinaryClassifier, BinaryOnly


class PrivateProbitClassifier(BinaryOnly, ClassifierMixin, BinaryClassifier):
    """Probit classification p(y = 1 | x) = Phi(x^T w + b) with (epsilon, delta)-differential
    privacy: a Gaussian posterior learnt by stochastic expectation propagation whose clipped sites
    are the released statistic (DP-SEP).

    - ``epsilon``, ``delta``: the budget one ``fit`` spends (cross-validation spends it per fit);
    - ``clip``: C, the public L2 bound on every site (``None``: the fit rule's, 1);
    - ``x_bound``: the L2 bound rows of X are clipped to before the intercept is appended
      (``None``: none; the sites' clip bounds the sensitivity either way);
    - ``fit_intercept``: the family's own intercept (a constant 1 after clipping);
    - ``prior_var``: the variance of the Gaussian prior of every weight;
    - ``classes``, ``steps``, ``non_private``, ``random_state``: as in
      :class:`~stream_vips.estimators.PrivateLogisticRegression`.

    >>> import numpy as np
    >>> from stream_vips.estimators import PrivateProbitClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(3000, 2))
    >>> y = (X @ [1.5, -1.0] + 0.3 + rng.normal(size=3000) > 0).astype(int)
    >>> clf = PrivateProbitClassifier(epsilon=1.0, random_state=0).fit(X, y)
    >>> bool(clf.score(X, y) > 0.75), clf.sample_posterior(5, random_state=0).shape
    (True, (5, 3))
    """

    family: ClassVar[str] = "sep_probit"
    bound_params: ClassVar[tuple[str, ...]] = ("clip", "x_clip")

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-5, clip: float | None = None,
                 x_bound: float | None = None, fit_intercept: bool = True, prior_var: float = 1.0,
                 classes: Sequence[Any] | None = None, steps: int | None = None, non_private: bool = False,
                 random_state: Any = None) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.clip = clip
        self.x_bound = x_bound
        self.fit_intercept = fit_intercept
        self.prior_var = prior_var
        self.classes = classes
        self.steps = steps
        self.non_private = non_private
        self.random_state = random_state

    def _family_intercept(self) -> bool:
        return True

    def _model_params(self, n_features: int) -> dict[str, Any]:
        params: dict[str, Any] = {"intercept": bool(self.fit_intercept), "x_clip": self.x_bound,
                                  "prior_var": self.prior_var}
        if self.clip is not None:
            params["clip"] = self.clip
        return params

    def _from_message(self, message: Any) -> None:
        self.n_features_in_ = int(message["hyperparameters"]["dim"])
        self.classes_ = np.asarray(self.classes if self.classes is not None else [0, 1])

    def _gaussian(self) -> tuple[np.ndarray, np.ndarray, float]:
        mean, cov = self.model_.posterior()
        return np.asarray(mean[0], dtype=float), np.asarray(cov[0], dtype=float), math.inf

    def _proba(self, Z: np.ndarray) -> np.ndarray:
        return np.asarray(self.model_.predict_proba(Z), dtype=float)

