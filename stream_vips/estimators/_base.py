"""What every estimator shares: the checks on X, the one call to :func:`stream_vips.fit` that
spends the budget, the fitted attributes, the report of the bounds used and the way back from a
model message.

The privacy guarantee is ``fit``'s (record-level (epsilon, delta)-DP under replace-one adjacency,
docs/privacy.md) and covers what the estimator releases: ``model_message_`` and everything computed
from it (predictions, posterior samples, intervals). Attributes computed from the training rows
themselves (a clusterer's ``labels_``) are not covered: they are for the data's holder. Every fit
spends its whole budget, so cross-validation and grid searches spend it once per fit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils._tags import Tags
from sklearn.utils.validation import check_is_fitted, validate_data

from stream_vips.errors import FitError
from stream_vips.records import NON_FINITE, WRONG_TYPE


@dataclasses.dataclass
class PrivateTags(Tags):
    """scikit-learn's tags plus the estimator checks that do not apply, each with its reason
    (``tests/test_estimators.py`` passes them to ``parametrize_with_checks`` as expected failures)."""

    expected_failed_checks: dict[str, str] = dataclasses.field(default_factory=dict)


#: The checks of scikit-learn's suite every private estimator fails by design, with the reason
#: (none today: every check that applies passes; the suite skips the sample-weight checks, since
#: ``fit`` takes no ``sample_weight``, and the array-API checks unless SCIPY_ARRAY_API is set).
COMMON_EXEMPTIONS: dict[str, str] = {}


def refuse_strings(X: Any, name: str = "X") -> None:
    """Refuse text before numpy reads it as numbers (``np.asarray(["1.5"], float)`` succeeds):
    the same ``wrong_type`` answer as a record whose value is a JSON string."""
    arr = X if isinstance(X, np.ndarray) else None
    if arr is None and hasattr(X, "dtypes"):  # a DataFrame: its object columns
        kinds = {getattr(dt, "kind", "O") for dt in np.atleast_1d(X.dtypes)}
        if kinds & {"U", "S", "O"}:
            arr = np.asarray(X, dtype=object)
    if arr is None and isinstance(X, (list, tuple)):
        arr = np.asarray(X, dtype=object)
    if arr is None:
        return
    if arr.dtype.kind in "US" or (arr.dtype.kind == "O" and any(isinstance(v, (str, bytes)) for v in arr.flat)):
        raise FitError(f"{WRONG_TYPE}: {name} holds strings; the estimators take numbers (encode categories "
                       "first, e.g. with OneHotEncoder)")


def refuse_non_finite(X: np.ndarray, name: str = "X") -> None:
    """Refuse NaN and infinity with the reason code records get for them (``non_finite``). A
    record-level fit rejects such a record (it still counts in N); an estimator follows
    scikit-learn and refuses the data before anything is spent."""
    bad = ~np.isfinite(X)
    if bad.any():
        rows = int(bad.reshape(len(X), -1).any(axis=1).sum()) if X.ndim > 1 else int(bad.sum())
        raise FitError(f"{NON_FINITE}: {name} contains NaN or infinity in {rows} row(s); impute or drop them "
                       "first (nothing was spent)")


def seed_of(random_state: Any) -> int | None:
    """``fit``'s seed from a scikit-learn ``random_state``: None stays None (fresh noise), an int
    is the seed, a RandomState gives one draw (a seeded fit reports ``seeded: true``)."""
    if random_state is None:
        return None
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return int(random_state)
    return int(check_random_state(random_state).randint(0, 2**31 - 1))


class PrivateEstimator(BaseEstimator):
    """The base of the private estimators: one ``family`` of :mod:`stream_vips.models`, fitted by
    :func:`stream_vips.fit` with its settings rule, spending the whole (``epsilon``, ``delta``)
    budget once per ``fit``.

    Fitted attributes: ``model_message_`` (the model message, schema model-message.v1: what
    ``stream-vips fit --out`` writes and the service publishes), ``posterior_`` (the family's model
    rebuilt from it), ``epsilon_spent_`` (infinite for ``non_private=True``), ``privacy_report_``
    (fit's report plus ``"bounds"``, the public clipping bounds used) and ``n_features_in_``.
    :meth:`from_message` goes back from a message to a fitted estimator.
    """

    family: ClassVar[str]
    #: The family's hyperparameters that are clipping bounds, printed by :meth:`report`.
    bound_params: ClassVar[tuple[str, ...]] = ()
    #: Checks of scikit-learn's suite that do not apply, each with its reason.
    exemptions: ClassVar[Mapping[str, str]] = {}

    # -- what a subclass states ------------------------------------------------------------------

    def _model_params(self, n_features: int) -> dict[str, Any]:
        """The family's parameters from the constructor's keywords (``None``: the rule's)."""
        return {}

    def _public_bounds(self) -> dict[str, Any]:
        """Bounds the estimator applies before the family (its own keywords), for the report."""
        return {}

    def _data(self, X: np.ndarray, y: np.ndarray | None) -> Any:
        """The data set ``fit`` takes, from validated X (and y)."""
        return X if y is None else (X, y)

    # -- scikit-learn ----------------------------------------------------------------------------

    def __sklearn_tags__(self) -> PrivateTags:
        tags = super().__sklearn_tags__()
        return PrivateTags(**{f.name: getattr(tags, f.name) for f in dataclasses.fields(Tags)},
                           expected_failed_checks={**COMMON_EXEMPTIONS, **self.exemptions})

    def _validate(self, X: Any, *, reset: bool) -> np.ndarray:
        """X as a float array through scikit-learn's checks, after our own: strings are
        ``wrong_type`` and NaN or infinity ``non_finite``, whichever door the data comes in by."""
        refuse_strings(X)
        X = validate_data(self, X, reset=reset, dtype=np.float64, ensure_all_finite=False)
        refuse_non_finite(X)
        return X

    def _validate_xy(self, X: Any, y: Any, *, y_numeric: bool) -> tuple[np.ndarray, np.ndarray]:
        """(X, y) for a supervised fit, checked as :meth:`_validate` checks X (and a numeric y for
        NaN and infinity)."""
        refuse_strings(X)
        X, y = validate_data(self, X, y, reset=True, dtype=np.float64, ensure_all_finite=False, y_numeric=y_numeric)
        refuse_non_finite(X)
        if y_numeric:
            refuse_non_finite(y, "y")
        return X, y

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the rebuilt model (it may hold LAPACK handles): the message suffices."""
        state = dict(self.__dict__)
        state.pop("posterior_", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "model_message_" in state:
            from stream_vips.models.posterior import posterior_from_message

            self.posterior_ = posterior_from_message(state["model_message_"])

    def _fit_private(self, X: np.ndarray, y: np.ndarray | None) -> Any:
        """One call to :func:`stream_vips.fit` (the budget is spent here) and the fitted attributes."""
        from stream_vips.fitting import fit

        _check_budget(self)
        params = self._model_params(X.shape[1])
        steps = getattr(self, "steps", None)
        result = fit(self._data(X, y), self.family, epsilon=float(self.epsilon), delta=float(self.delta),
                     non_private=bool(self.non_private), seed=seed_of(self.random_state), steps=steps,
                     model_id=type(self).__name__, **params)
        report = dict(result.report)
        report["bounds"] = {**self._public_bounds(), **_bounds(result.message, self.bound_params)}
        self._set_fitted(result.message, report)
        return self

    def _set_fitted(self, message: Mapping[str, Any], report: dict[str, Any]) -> None:
        from stream_vips.models.posterior import posterior_from_message

        self.model_message_ = dict(message)
        self.posterior_ = posterior_from_message(message)
        self.epsilon_spent_ = float(self.posterior_.epsilon_spent)
        self.privacy_report_ = report

    @property
    def model_(self) -> Any:
        """The family's model (the posterior, with its own predictive methods)."""
        check_is_fitted(self, "posterior_")
        return self.posterior_.model

    @classmethod
    def from_message(cls, message: Mapping[str, Any], **params: Any) -> PrivateEstimator:
        """A fitted estimator from a model message (``model_message_``, ``stream-vips fit --out``,
        a message the service published). ``params`` are the keywords of the estimator that made
        it where they change its inputs' preprocessing (the message carries the model, not the
        estimator: e.g. ``fit_intercept=False`` for a model fitted by ``stream-vips fit`` on
        records). Reading a message spends nothing (post-processing)."""
        from stream_vips.models.posterior import check_message

        msg = check_message(dict(message))
        if msg["family"] != cls.family:
            raise FitError(f"message: a {msg['family']} model, but {cls.__name__} reads {cls.family} models")
        privacy = msg["privacy"]
        private = privacy.get("private", True) is not False
        est = cls(**{"epsilon": float(privacy["epsilon_budget"]) if private else 1.0,
                     "delta": float(privacy["delta"]), "non_private": not private, **params})
        est._from_message(msg)  # the message alone (its width may decide the public bounds)
        bounds = {**est._public_bounds(), **_bounds(msg, cls.bound_params)}
        est._set_fitted(msg, {"privacy": dict(privacy), "bounds": bounds})
        return est

    def _from_message(self, message: Mapping[str, Any]) -> None:
        """The estimator's own fitted attributes, read from a message (``n_features_in_`` ...)."""
        self.n_features_in_ = int(message["hyperparameters"]["dim"])

    def report(self) -> str:
        """A few lines: the family, the budget spent, the public bounds used (why each was chosen),
        how far the model moved from its prior (or why that cannot be said) and fit's warnings
        (e.g. a regime where the family's benchmark found it learns little)."""
        check_is_fitted(self, "posterior_")
        r = self.privacy_report_
        p = r["privacy"]
        spent = "non-private (no guarantee)" if math.isinf(self.epsilon_spent_) else \
            f"epsilon spent {self.epsilon_spent_:.6g} of {p.get('epsilon_budget')}, delta {p['delta']:g}"
        lines = [f"{type(self).__name__} ({self.family}): {spent}; seeded: {r['privacy'].get('seeded')}"]
        why = r.get("why", {})
        for name, value in r.get("bounds", {}).items():
            lines.append(f"  bound {name} = {value}" + (f" ({why[name]})" if name in why else ""))
        moved = r.get("movement") or self.posterior_.model.movement()  # from the message: post-processing
        lines.append(f"  moved: {moved['line']}")
        lines.extend(f"  warning: {line}" for line in r.get("warnings", []))
        return "\n".join(lines)


def _bounds(message: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The public clipping bounds a message's model was fitted with."""
    hyper = message["hyperparameters"]
    return {name: hyper.get(name) for name in names}


def _check_budget(est: PrivateEstimator) -> None:
    """epsilon and delta as fit wants them, named as the estimator's keywords."""
    for name in ("epsilon", "delta"):
        value = getattr(est, name)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise FitError(f"{name}: expected a number, got {type(value).__name__}")


def require_bound(value: Any, name: str, family: str, example: str) -> float:
    """A clipping bound given as a positive number; ``None`` or ``"auto"`` is refused, naming the
    keyword: a bound read from the data would leak it (the estimator never computes one)."""
    if value is None or isinstance(value, str) or isinstance(value, bool) or not float(value) > 0 \
            or not math.isfinite(float(value)):
        raise FitError(f"{name}: {family} needs a public bound > 0, got {value!r}; set {name}= from what is known "
                       f"about the data without looking at it ({example}); a bound computed from the data would "
                       "leak it, so none is computed")
    return float(value)
