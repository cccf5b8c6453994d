"""Model families behind the common protocol in :mod:`stream_vips.models.base`, and their registry.

>>> model_class("linreg").__name__
'LinearRegression'
>>> dimension("sbn")
('y', 'n_visible')
"""

from __future__ import annotations

import importlib

from stream_vips.errors import ConfigError

#: Model families: name -> module defining exactly one Model subclass with that ``family``.
MODEL_FAMILIES: dict[str, str] = {
    "linreg": "stream_vips.models.linreg",
    "logistic": "stream_vips.models.logistic",
    "lda": "stream_vips.models.lda",
    "sbn": "stream_vips.models.sbn",
    "sep_mixture": "stream_vips.models.sep.mixture",
    "sep_probit": "stream_vips.models.sep.probit",
    "sep_bnn": "stream_vips.models.sep.bnn",
    "dpvi": "stream_vips.models.baselines.dpvi",
    "sgld": "stream_vips.models.baselines.sgld",
    "ops": "stream_vips.models.baselines.ops",
}


def model_class(family: str) -> type:
    """The Model subclass registered for ``family`` (imported on first use)."""
    from stream_vips.models.base import Model

    if family not in MODEL_FAMILIES:
        raise ConfigError(f"model.family: unknown family {family!r} (known: {', '.join(sorted(MODEL_FAMILIES))})")
    module = importlib.import_module(MODEL_FAMILIES[family])
    found = [obj for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, Model) and getattr(obj, "family", None) == family]
    if len(found) != 1:
        raise ConfigError(f"model.family: module {module.__name__} defines {len(found)} models of family {family!r}")
    return found[0]


def dimension(family: str) -> tuple[str, str]:
    """(record field, model parameter) of a family's public dimension d."""
    cls = model_class(family)
    return cls.record_field, cls.dim_param
