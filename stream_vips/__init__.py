"""stream_vips: differentially private Bayesian inference (VIPS, DP-SEP) on event streams.

The public API, importable from here (each name is loaded on first use, so ``import stream_vips``
stays cheap):

* :class:`PrivateLearner` -- one model family learning privately from records you feed it
  (notebooks: an in-memory ledger unless ``ledger_path=`` is given, no metrics server);
* :func:`fit` -- a finite data set, with settings chosen from public quantities, spending the
  whole budget;
* :class:`Application` -- the streaming runtime (sources, sinks, ledger, metrics, signals);
* :func:`load_config` / :func:`config_from_dict` -- validated configuration;
* :func:`posterior_from_message` and :class:`ModelReader` -- the read side of model messages;
* :mod:`stream_vips.estimators` -- scikit-learn estimators over the families (``PrivateLogisticRegression``,
  ``PrivateLinearRegression``, ...; each ``fit`` is one :func:`fit`), also importable from here;
* :func:`make_accountant`, :class:`BudgetMonitor`, :class:`SubsampledGaussianEvent` -- accounting;
* :class:`StreamVipsError` -- the root of every error raised on purpose (and :class:`ConfigError`).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "PrivateLearner": "stream_vips.core.learner",
    "fit": "stream_vips.fitting",
    "FitResult": "stream_vips.fitting",
    "Application": "stream_vips.service.app",
    "load_config": "stream_vips.service.build",
    "config_from_dict": "stream_vips.service.build",
    "posterior_from_message": "stream_vips.client",
    "ModelReader": "stream_vips.client",
    "make_accountant": "stream_vips.privacy.accountants",
    "BudgetMonitor": "stream_vips.privacy.budget",
    "SubsampledGaussianEvent": "stream_vips.privacy.events",
    "StreamVipsError": "stream_vips.errors",
    **dict.fromkeys(["PrivateLogisticRegression", "PrivateProbitClassifier", "PrivateLinearRegression",
                     "PrivateBNNRegressor", "PrivateGaussianMixture", "PrivateLDA", "PrivateSigmoidBeliefNetwork"],
                    "stream_vips.estimators"),
    "ConfigError": "stream_vips.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stream_vips' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
