"""Shared pieces of the families' posterior summaries (:meth:`~stream_vips.models.base.Model.summary`).

A summary is post-processing of the released natural parameters: the family computes it from its
state, which a reader rebuilds from a message alone. It is written into every model message as
plain JSON numbers (docs/model-topic.md), so matrices are included only up to
:data:`MATRIX_LIMIT` rows; a larger model's summary says where the rest is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: Largest dimension whose full covariance (d x d numbers) a summary carries.
MATRIX_LIMIT = 64
#: Largest number of topic-word means (K x V) an LDA summary carries in full.
TABLE_LIMIT = 20_000

#: pi / 8, the constant of the probit approximation sigmoid(m / sqrt(1 + pi s^2 / 8)).
PROBIT_SCALE = math.pi / 8.0


def plain(value: Any) -> Any:
    """``value`` as plain JSON: numpy arrays and scalars as lists and numbers, NaN and infinity as
    ``None`` (strict JSON has neither)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


def coefficients(mean: np.ndarray, cov: np.ndarray, predictive: str, matrix: str | None = "covariance",
                 notes: tuple[str, ...] = (), **constants: Any) -> dict[str, Any]:
    """A posterior over a coefficient vector: ``mean``, marginal ``sd`` (from the diagonal of
    ``cov``), the matrix the ``predictive`` rule names (``cov`` under the key ``matrix``, when
    d <= :data:`MATRIX_LIMIT`; ``None``: the rule needs no matrix) and the rule's ``constants``."""
    mean, cov = np.asarray(mean, dtype=float), np.asarray(cov, dtype=float)
    out: dict[str, Any] = {"kind": "coefficients", "predictive": predictive, **constants,
                           "mean": mean.tolist(), "sd": np.sqrt(np.clip(np.diag(cov), 0, None)).tolist()}
    extra = list(notes)
    if matrix is None:
        pass
    elif mean.size <= MATRIX_LIMIT:
        out[matrix] = cov.tolist()
    else:
        extra.append(f"{matrix} omitted (d = {mean.size} > {MATRIX_LIMIT}): the rule needs it, "
                     "derive it from the natural parameters")
    out["notes"] = extra
    return out


def movement(summary: Mapping[str, Any], prior: tuple[np.ndarray, np.ndarray] | str) -> dict[str, Any]:
    """How far a released posterior mean is from the public prior mean, in prior sds.

    ``summary`` is the family's :meth:`~stream_vips.models.base.Model.summary` (its ``mean`` for
    ``kind: coefficients``, each row of ``means`` for ``kind: mixture``) and ``prior`` the
    family's ``prior_location``: (mean, sd), broadcast against the coefficients, or a string
    saying why there is none. Returns ``{"known": True, "rms", "max", "beyond_one_sd", "count",
    "line"}``: |m_i - m0_i| / s0_i over the coefficients (root mean square, largest, how many
    exceed 1). A model that learnt nothing keeps its prior mean (0 prior sds); noise moves it
    too, so the number says how far the model went, not that it went the right way. Otherwise
    ``{"known": False, "line": why}``. Post-processing of released values and public
    configuration only: nothing here reads data, so it spends no budget."""
    if isinstance(prior, str):
        return {"known": False, "line": f"how far the model moved from its prior cannot be said: {prior}"}
    kind = summary.get("kind")
    if kind == "coefficients":
        mean = np.asarray(summary.get("mean", []), dtype=float)
    elif kind == "mixture":
        mean = np.asarray(summary.get("means", []), dtype=float)
    else:
        return {"known": False, "line": f"how far the model moved from its prior cannot be said: a {kind or 'bare'} "
                                        "summary has no coefficient means to compare with a prior"}
    m0, s0 = (np.asarray(a, dtype=float) for a in prior)
    try:
        z = np.abs(mean - m0) / s0
    except ValueError:
        return {"known": False, "line": (f"how far the model moved from its prior cannot be said: the prior's shape "
                                         f"{m0.shape} does not match the summary's {mean.shape}")}
    if z.size == 0 or not np.all(np.isfinite(z)):
        return {"known": False, "line": "how far the model moved from its prior cannot be said: no finite "
                                        "coefficient to compare"}
    rms, top, beyond = float(np.sqrt(np.mean(z ** 2))), float(z.max()), int((z > 1.0).sum())
    what = "posterior mean" if kind == "coefficients" else "component means"
    return {"known": True, "rms": rms, "max": top, "beyond_one_sd": beyond, "count": int(z.size),
            "line": (f"the {what} moved {rms:.3g} prior sd from the prior mean (root mean square over {z.size} "
                     f"coefficients; largest {top:.3g}, {beyond} beyond 1 sd): post-processing of the released "
                     "model, no budget")}
