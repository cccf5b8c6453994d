"""The model families: one line per family, naming the module that defines it.

A family is its module: the :class:`~stream_vips.models.base.Model` subclass there carries
everything the rest of the package knows about the family (its records, parameters, fit rule,
synthetic data, demo, audit pair and report summary; see :mod:`stream_vips.models.base`).
Adding a family is its module, one line in :data:`MODEL_FAMILIES`, its tests and the
regenerated docs/families.md (``python -m stream_vips.models.registry --write-docs
docs/families.md``). This module imports no family until one is asked for, so command-line
help can list the families without loading numpy or scipy.

>>> model_class("linreg").__name__
'LinearRegression'
>>> dimension("sbn")
('y', 'n_visible')
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from stream_vips.errors import ConfigError

if TYPE_CHECKING:
    from stream_vips.models.base import Model

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


def model_class(family: str) -> type[Model]:
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
