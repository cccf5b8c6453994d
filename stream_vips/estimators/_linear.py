"""The linear families' common parts: the design matrix (a public intercept column and public
scaling), the Gaussian posterior over the coefficients (samples and credible intervals), and the
binary classifier's labels."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets, type_of_target
from sklearn.utils.validation import check_is_fitted

from stream_vips.errors import FitError
from stream_vips.estimators._base import PrivateEstimator


class LinearPosterior(PrivateEstimator):
    """A posterior over the weights w of a linear model in the design space Z (the family's
    inputs), with ``coef_`` and ``intercept_`` in the space of X: Z = c [X - m, b] with an
    intercept column of public value b (``fit_intercept``), or Z = c (X - m), for a public centre m
    (zero unless the estimator has one); so w^T z = c w_x^T x + (c b w_b - c w_x^T m)."""

    def _design_scale(self) -> tuple[float, float]:
        """(c, b): the design's public scale and intercept column value."""
        return 1.0, 1.0

    def _centre(self) -> np.ndarray | None:
        """The public centre m subtracted from X's rows (``None``: none), after any public clip."""
        return None

    def _prepare(self, X: np.ndarray) -> np.ndarray:
        """X as the design sees it before scaling: clipped to a public range (none here)."""
        return X

    def _design(self, X: np.ndarray) -> np.ndarray:
        c, b = self._design_scale()
        X = self._prepare(X)
        m = self._centre()
        if m is not None:
            X = X - m
        if getattr(self, "fit_intercept", False) and not self._family_intercept():
            return c * np.hstack([X, np.full((len(X), 1), b)])
        return c * X

    def _family_intercept(self) -> bool:
        """Whether the family appends its own intercept (then the design adds none)."""
        return False

    def _gaussian(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Mean, covariance (for a Student-t: its scale matrix) and degrees of freedom (inf:
        Gaussian) of the posterior of w in Z space."""
        raise NotImplementedError

    def _to_x_space(self) -> np.ndarray:
        """The matrix A with (coef, intercept) = A w."""
        c, b = self._design_scale()
        d = self.n_features_in_
        scale = np.full(d + 1 if getattr(self, "fit_intercept", False) else d, c)
        if len(scale) > d:
            scale[d] = c * b
        A = np.diag(scale)
        m = self._centre()
        if m is not None and len(scale) > d:  # the intercept absorbs the centre: -c w_x^T m
            A[d, :d] = -c * m
        return A

    def _moments(self) -> tuple[np.ndarray, np.ndarray, float]:
        check_is_fitted(self, "posterior_")
        mean, cov, dof = self._gaussian()
        A = self._to_x_space()
        return A @ mean, A @ cov @ A.T, dof

    @property
    def coef_(self) -> np.ndarray:
        """The posterior mean of the coefficients of X's columns."""
        mean, _, _ = self._moments()
        return mean[: self.n_features_in_]

    @property
    def intercept_(self) -> float:
        """The posterior mean of the intercept (0.0 without one)."""
        mean, _, _ = self._moments()
        return float(mean[self.n_features_in_]) if len(mean) > self.n_features_in_ else 0.0

    def sample_posterior(self, n: int, random_state: Any = None) -> np.ndarray:
        """``n`` draws of (coefficients, intercept if fitted) from the posterior, shape (n, d [+ 1]):
        post-processing of the release, so drawing spends nothing."""
        mean, cov, dof = self._moments()
        rng = check_random_state(random_state)
        draws = rng.standard_normal((int(n), len(mean))) @ np.linalg.cholesky(cov).T
        if math.isfinite(dof):  # a Student-t: a Gaussian scaled by sqrt(dof / chi2(dof))
            draws = draws * np.sqrt(dof / rng.chisquare(dof, size=(int(n), 1)))
        return mean + draws

    def credible_intervals(self, level: float = 0.95) -> np.ndarray:
        """Equal-tailed marginal credible intervals of (coefficients, intercept if fitted) at
        ``level``, shape (d [+ 1], 2)."""
        if not 0 < level < 1:
            raise FitError(f"level: expected a probability in (0, 1), got {level!r}")
        mean, cov, dof = self._moments()
        q = stats.norm.ppf(0.5 + level / 2) if not math.isfinite(dof) else stats.t.ppf(0.5 + level / 2, dof)
        half = q * np.sqrt(np.clip(np.diag(cov), 0, None))
        return np.column_stack([mean - half, mean + half])


class BinaryOnly:
    """The tag of a binary classifier (a mixin left of ``ClassifierMixin``, which sets the
    classifier tags)."""

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.classifier_tags.multi_class = False
        return tags


class BinaryClassifier(LinearPosterior):
    """Two classes: ``classes`` (public, the recommended way: labels outside them are rejected as
    records, ``out_of_range``, and still count in N) or, as scikit-learn does, the two labels
    found in y (the label set is then read from the data and treated as public schema)."""

    def fit(self, X: Any, y: Any) -> BinaryClassifier:
        """Fit privately to (X, y), spending the whole budget once."""
        X, y = self._validate_xy(X, y, y_numeric=False)
        check_classification_targets(y)
        if self.classes is not None:
            classes = np.asarray(self.classes)
            if classes.shape != (2,) or classes[0] == classes[1]:
                raise FitError(f"classes: expected two distinct labels, got {self.classes!r}")
        else:
            classes = np.unique(y)
            if type_of_target(y) not in ("binary",) or len(classes) != 2:
                raise FitError(f"y: Only binary classification is supported. The type of the target is "
                               f"{type_of_target(y)} with {len(classes)} class(es); {type(self).__name__} needs two "
                               "(or classes=[negative, positive])")
        self.classes_ = classes
        labels = np.full(len(y), 2.0)  # outside {0, 1}: rejected by the family as out_of_range
        labels[y == classes[0]] = 0.0
        labels[y == classes[1]] = 1.0
        return self._fit_private(self._design(X), labels)

    def _from_message(self, message: Any) -> None:
        d = int(message["hyperparameters"]["dim"])
        with_intercept = bool(getattr(self, "fit_intercept", False)) and not self._family_intercept()
        self.n_features_in_ = d - 1 if with_intercept else d
        self.classes_ = np.asarray(self.classes if self.classes is not None else [0, 1])

    def _proba(self, Z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities integrated over the posterior, shape (n, 2), in ``classes_`` order."""
        check_is_fitted(self, "posterior_")
        X = self._validate(X, reset=False)
        p = np.clip(self._proba(self._design(X)), 0.0, 1.0)
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Any) -> np.ndarray:
        """The more probable class of each row."""
        check_is_fitted(self, "posterior_")
        return self.classes_[(self.predict_proba(X)[:, 1] > 0.5).astype(int)]
