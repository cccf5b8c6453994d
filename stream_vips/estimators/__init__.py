"""scikit-learn estimators over the model families: each ``fit`` calls :func:`stream_vips.fit`
once (the family's settings rule, the whole (epsilon, delta) budget spent) and keeps the model
message it makes; predictions are post-processing of that release.

Classifiers: :class:`PrivateLogisticRegression` (``logistic``), :class:`PrivateProbitClassifier`
(``sep_probit``). Regressors: :class:`PrivateLinearRegression` (``linreg``),
:class:`PrivateBNNRegressor` (``sep_bnn``). Clusterer: :class:`PrivateGaussianMixture`
(``sep_mixture``). Transformers: :class:`PrivateLDA` (``lda``, topic proportions) and
:class:`PrivateSigmoidBeliefNetwork` (``sbn``, latent codes).

Every fit spends its budget: cross-validation with k folds spends it k times (and a grid search
once per candidate and fold), each on data the others overlap, so the guarantee of the whole
search is their composition.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (loaded on first use: scikit-learn is imported then)
_EXPORTS: dict[str, str] = {
    "PrivateLogisticRegression": f"{__name__}.logistic",
    "PrivateProbitClassifier": f"{__name__}.probit",
    "PrivateLinearRegression": f"{__name__}.linreg",
    "PrivateBNNRegressor": f"{__name__}.bnn",
    "PrivateGaussianMixture": f"{__name__}.mixture",
    "PrivateLDA": f"{__name__}.lda",
    "PrivateSigmoidBeliefNetwork": f"{__name__}.sbn",
    "PrivateEstimator": f"{__name__}._base",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
