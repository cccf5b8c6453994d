"""Private Bayesian logistic regression (the ``logistic`` family) as a scikit-learn classifier."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from sklearn.base import ClassifierMixin

from stream_vips.estimators._base import require_bound
from stream_vips.estimators._linear import BinaryClassifier, BinaryOnly


class PrivateLogisticRegression(BinaryOnly, ClassifierMixin, BinaryClassifier):
    """Bayesian logistic regression with (epsilon, delta)-differential privacy (Pólya-Gamma VIPS).

    ``fit`` calls :func:`stream_vips.fit` once with the family's settings rule (docs/fit.md) and
    spends the whole budget; ``predict_proba`` integrates over the Gaussian posterior q(w).

    - ``epsilon``, ``delta``: the budget one ``fit`` spends (cross-validation spends it per fit);
    - ``x_bound``: the public L2 bound of a row of X (default 1: scale the features first with
      public constants, e.g. min-max to known ranges, divided by sqrt(d)); rows are divided by it
      and clipped to norm 1, the family's bound, so a row within it is never clipped. It is never
      read from the data;
    - ``fit_intercept``: append a public constant column; with it a row is [x, x_bound] / (sqrt(2)
      x_bound), whose norm is at most 1 when |x| <= x_bound;
    - ``classes``: the two labels (negative, positive), public (``None``: the two found in y);
    - ``floor_factor``, ``release``: the family's parameters (``None``: the fit rule's);
    - ``steps``: the number of steps (``None``: the fit rule's);
    - ``non_private``: the baseline without noise (no guarantee; ``epsilon_spent_`` is inf);
    - ``random_state``: seeds the noise (reported as ``seeded: true``: reproducible, for tests).

    >>> import numpy as np
    >>> from stream_vips.estimators import PrivateLogisticRegression
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(-0.5, 0.5, (2000, 2))
    >>> y = (X @ [3.0, -2.0] + 0.3 * rng.logistic(size=2000) > 0).astype(int)
    >>> clf = PrivateLogisticRegression(epsilon=1.0, random_state=0).fit(X, y)
    >>> clf.epsilon_spent_ <= 1.0, clf.score(X, y) > 0.85
    (True, True)
    >>> clf.predict_proba([[0.4, -0.4]]).round(2).shape, clf.credible_intervals().shape
    ((1, 2), (3, 2))
    """

    family: ClassVar[str] = "logistic"

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-5, x_bound: float = 1.0, fit_intercept: bool = True,
                 classes: Sequence[Any] | None = None, floor_factor: float | None = None, release: str | None = None,
                 steps: int | None = None, non_private: bool = False, random_state: Any = None) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.x_bound = x_bound
        self.fit_intercept = fit_intercept
        self.classes = classes
        self.floor_factor = floor_factor
        self.release = release
        self.steps = steps
        self.non_private = non_private
        self.random_state = random_state

    def _design_scale(self) -> tuple[float, float]:
        b = require_bound(self.x_bound, "x_bound", self.family, "e.g. 1 after min-max scaling divided by sqrt(d)")
        return (1.0 / (math.sqrt(2.0) * b), b) if self.fit_intercept else (1.0 / b, b)

    def _model_params(self, n_features: int) -> dict[str, Any]:
        return {k: v for k, v in (("floor_factor", self.floor_factor), ("release", self.release)) if v is not None}

    def _public_bounds(self) -> dict[str, Any]:
        return {"x_bound": self.x_bound, "row norm after scaling (the family's clip)": 1.0}

    def _gaussian(self) -> tuple[np.ndarray, np.ndarray, float]:
        m = self.model_
        return np.asarray(m.mu, dtype=float), np.asarray(m.Sigma, dtype=float), math.inf

    def _proba(self, Z: np.ndarray) -> np.ndarray:
        return np.asarray(self.model_.predict_proba(Z), dtype=float)
