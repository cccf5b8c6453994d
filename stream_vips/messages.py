"""Model messages: build, encode, validate and decode (schema ``schemas/model-message.v1.json``).

A message carries configuration and privatized natural parameters only (privacy rule 8 in
docs/privacy.md). Arrays are encoded compactly as base64 of their little-endian C-order bytes
with dtype and shape, so a float64 round trip is bit-exact.

>>> import numpy as np
>>> report = privacy_report(epsilon_spent=0.5, delta=1e-5, epsilon_budget=1.0, accountant="pld",
...                         sampling="poisson", q=0.1, noise_multiplier=2.0, steps=3,
...                         halted=False, seeded=True)
>>> msg = build_message("m1", "linreg", {"dim": 2}, 2, {"shift": np.array([0.5, -1.0])}, report)
>>> validate_message(loads(dumps(msg)))["privacy"]["paper_sigma"]
1.0
>>> decode_state(msg)["shift"].tolist()
[0.5, -1.0]

A run without noise (``privacy.mode: non_private``) claims no guarantee. Its report carries
``"private": false`` and ``null`` epsilon and budget, never a made-up number (JSON has no
infinity):

>>> baseline = privacy_report(epsilon_spent=float("inf"), delta=1e-5, epsilon_budget=float("inf"),
...                           accountant="none", sampling="poisson", q=1.0, noise_multiplier=0.0,
...                           steps=3, halted=False, seeded=True, private=False)
>>> baseline["private"], baseline["epsilon_spent"], baseline["epsilon_budget"]
(False, None, None)
>>> is_private(loads(dumps(build_message("m1", "linreg", {"dim": 2}, 2, {"shift": np.zeros(2)}, baseline))))
False
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema
import numpy as np

SCHEMA_VERSION = 1
SCHEMA_FILE = "model-message.v1.json"
ENCODING = "base64-le"
DTYPES = ("float64", "float32", "int64", "int32")


class MessageError(ValueError):
    """A model message does not follow the schema or its arrays do not decode."""


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The model message JSON Schema shipped in the package."""
    text = resources.files("stream_vips").joinpath("schemas", SCHEMA_FILE).read_text("utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema())
    return jsonschema.Draft202012Validator(schema(), format_checker=jsonschema.FormatChecker())


def encode_array(arr: np.ndarray, dtype: str = "float64") -> dict[str, Any]:
    """``{"dtype", "shape", "encoding": "base64-le", "data"}`` for ``arr`` cast to ``dtype``."""
    if dtype not in DTYPES:
        raise ValueError(f"array dtype must be one of {DTYPES}, got {dtype!r}")
    a = np.asarray(arr)
    if a.dtype.kind not in "fiub":
        raise ValueError(f"cannot encode an array of dtype {a.dtype}")
    le = np.asarray(a, dtype=np.dtype(dtype).newbyteorder("<"), order="C")
    return {
        "dtype": dtype,
        "shape": list(le.shape),
        "encoding": ENCODING,
        "data": base64.b64encode(le.tobytes()).decode("ascii"),
    }


def decode_array(obj: Mapping[str, Any]) -> np.ndarray:
    """Inverse of :func:`encode_array` (a writable array in native byte order)."""
    try:
        dtype, shape, encoding, data = obj["dtype"], obj["shape"], obj["encoding"], obj["data"]
    except (KeyError, TypeError):
        raise MessageError("encoded array needs dtype, shape, encoding and data") from None
    if encoding != ENCODING:
        raise MessageError(f"unknown array encoding {encoding!r}, expected {ENCODING!r}")
    if dtype not in DTYPES:
        raise MessageError(f"unknown array dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise MessageError(f"array shape must be a list of non-negative integers, got {shape!r}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, TypeError, ValueError) as exc:
        raise MessageError(f"array data is not valid base64: {exc}") from None
    le = np.dtype(dtype).newbyteorder("<")
    expected = math.prod(shape) * le.itemsize  # Python ints: np.prod wraps around for huge shapes
    if len(raw) != expected:
        raise MessageError(f"array data has {len(raw)} bytes, shape {shape} of {dtype} needs {expected}")
    return np.frombuffer(raw, dtype=le).reshape(shape).astype(np.dtype(dtype))


def privacy_report(
    *,
    epsilon_spent: float,
    delta: float,
    epsilon_budget: float,
    accountant: str,
    sampling: str,
    q: float,
    noise_multiplier: float,
    steps: int,
    halted: bool,
    seeded: bool,
    adjacency: str = "replace_one",
    diameter: float = 2.0,
    ledger_id: str | None = None,
    private: bool = True,
    window_steps: int | None = None,
    unit: str = "record",
    max_records_per_key: int | None = None,
) -> dict[str, Any]:
    """The ``privacy`` section; ``paper_sigma = z / diameter`` (z/2 by default, privacy rule 2 in
    docs/privacy.md).

    ``private=False`` is a non-private run (z = 0, no ledger): it claims no guarantee, so
    ``epsilon_spent`` and ``epsilon_budget`` are ``None`` (JSON null) whatever was passed, the
    accountant is ``"none"`` and ``"private": false`` says so; ``delta`` is echoed from the
    configuration only. A private report carries ``"private": true``. ``window_steps`` = L says
    the accounting is per record over the at most L steps a record can be in (window accounting:
    ``epsilon_spent`` is then the most any record has spent); otherwise the accounting composes
    the whole stream.

    ``unit`` says whom epsilon protects: one record (``"record"``, privacy rule 1) or one key,
    i.e. all records of one person whatever their number (``"key"``, privacy rule 12, reported
    with ``max_records_per_key``).
    """
    if private:
        eps, budget, acct = float(epsilon_spent), float(epsilon_budget), str(accountant)
    else:
        if float(noise_multiplier) != 0.0:
            raise ValueError(f"a non-private report has noise multiplier 0, got {noise_multiplier!r}")
        eps, budget, acct, ledger_id = None, None, "none", None
    return {
        "epsilon_spent": eps,
        "delta": float(delta),
        "epsilon_budget": budget,
        "accountant": acct,
        "sampling": str(sampling),
        "q": float(q),
        "noise_multiplier": float(noise_multiplier),
        "paper_sigma": float(noise_multiplier) / float(diameter),
        "diameter": float(diameter),
        "adjacency": str(adjacency),
        "steps": int(steps),
        "halted": bool(halted),
        "seeded": bool(seeded),
        "private": bool(private),
        **({"ledger_id": str(ledger_id)} if ledger_id is not None else {}),
        "accounting": "stream" if window_steps is None else "window",
        **({"window_steps": int(window_steps)} if window_steps is not None else {}),
        "unit": str(unit),
        **({"max_records_per_key": int(max_records_per_key)} if max_records_per_key is not None else {}),
    }


SPEND_RTOL = 1e-6
"""Relative slack allowed for ``epsilon_spent`` over ``epsilon_budget``: the budget monitor admits a
step only when the composed epsilon stays within the budget (a calibrated fit spends
[budget / (1 + 1e-3)^2, budget], docs/fit.md; a halted run at most the budget), so only float
round-off between the admission check and the report may exceed it."""


def _claims_private(privacy: Mapping[str, Any]) -> bool:
    """``privacy.private``, or for messages from before the flag existed: a finite epsilon (the old
    non-private report carried infinity, which strict JSON cannot hold)."""
    flag = privacy.get("private")
    if flag is not None:
        return bool(flag)
    eps = privacy.get("epsilon_spent")
    return isinstance(eps, (int, float)) and math.isfinite(eps)


def _privacy_problem(privacy: Mapping[str, Any]) -> str | None:
    """Why a report claiming privacy does not back the claim (``None`` when it does or claims none).

    A claim is backed only by noise (z > 0, finite), an accountant other than ``"none"``, a finite
    ``epsilon_spent`` and a finite budget it does not exceed (up to :data:`SPEND_RTOL`).
    """
    if not _claims_private(privacy):
        return None
    z, acct = privacy.get("noise_multiplier"), privacy.get("accountant")
    eps, budget = privacy.get("epsilon_spent"), privacy.get("epsilon_budget")
    number = (int, float)
    if not (isinstance(z, number) and math.isfinite(z) and z > 0):
        return f"noise_multiplier {z!r} adds no noise"
    if not isinstance(acct, str) or acct == "none":
        return f"accountant {acct!r} accounts nothing"
    if not (isinstance(eps, number) and math.isfinite(eps) and eps >= 0):
        return f"epsilon_spent {eps!r} is not a finite number >= 0"
    if not (isinstance(budget, number) and math.isfinite(budget) and budget > 0):
        return f"epsilon_budget {budget!r} is not a finite number > 0"
    if eps > budget * (1.0 + SPEND_RTOL):
        return f"epsilon_spent {eps:g} exceeds epsilon_budget {budget:g}"
    return None


def is_private(msg: Mapping[str, Any]) -> bool:
    """Whether a message carries a differential-privacy guarantee: it claims one (``privacy.private``
    true, or absent with a finite epsilon in messages from before the flag existed) and backs it
    with noise (z > 0), a real accountant and a finite epsilon within the budget. A claim without
    that backing is not private (:func:`validate_message` refuses such a message).

    >>> r = {"private": True, "noise_multiplier": 0.0, "accountant": "none",
    ...      "epsilon_spent": 1.0, "epsilon_budget": 2.0}
    >>> is_private({"privacy": r}), is_private({"privacy": {**r, "noise_multiplier": 2.0, "accountant": "pld"}})
    (False, True)
    """
    privacy = msg["privacy"]
    return _claims_private(privacy) and _privacy_problem(privacy) is None


def check_privacy(privacy: Mapping[str, Any]) -> None:
    """Raise :class:`MessageError` with a one-line reason when a privacy report claims a guarantee
    it does not back (see :func:`is_private`); a report claiming none passes."""
    problem = _privacy_problem(privacy)
    if problem is not None:
        raise MessageError(f"model message claims privacy it does not have: {problem}")


def build_message(
    model_id: str,
    family: str,
    hyperparameters: Mapping[str, Any],
    version: int,
    state: Mapping[str, np.ndarray],
    privacy: Mapping[str, Any],
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """A schema-valid message for one published model (validated before it is returned)."""
    when = created_at or datetime.now(UTC)
    msg = {
        "schema_version": SCHEMA_VERSION,
        "model_id": model_id,
        "family": family,
        "hyperparameters": dict(hyperparameters),
        "version": int(version),
        "created_at": when.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "natural_parameters": {name: encode_array(arr) for name, arr in state.items()},
        "privacy": dict(privacy),
    }
    return validate_message(msg)


def validate_message(msg: Any) -> Any:
    """Return ``msg`` if it follows the schema and backs any privacy claim it makes (see
    :func:`is_private`; a ratio like epsilon_spent <= epsilon_budget or finiteness is beyond JSON
    Schema), else raise :class:`MessageError` with a one-line reason."""
    errors = sorted(_validator().iter_errors(msg), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "(message)"
        # jsonschema quotes the offending value; a long one is named by the rule it breaks instead
        text = err.message if len(err.message) <= 160 else f"breaks the schema's {err.validator!r} rule"
        raise MessageError(f"model message invalid at {where}: {text}")
    check_privacy(msg["privacy"])
    return msg


def decode_state(msg: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The natural parameters of a message as numpy arrays.

    Every family's natural parameters are finite, so a NaN or infinity is refused here: such a
    state is no posterior, and a reader must not serve it as a model.
    """
    state = {name: decode_array(obj) for name, obj in msg["natural_parameters"].items()}
    bad = sorted(name for name, arr in state.items() if not np.all(np.isfinite(arr)))
    if bad:
        raise MessageError(f"natural parameters {bad} contain NaN or infinity")
    return state


def dumps(msg: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON (strict: NaN or infinity raise rather than produce invalid JSON)."""
    return json.dumps(msg, separators=(",", ":"), allow_nan=False).encode("utf-8")


def loads(data: bytes | str, validate: bool = True) -> dict[str, Any]:
    """Parse a message (and validate it against the schema unless ``validate=False``)."""
    try:
        msg = json.loads(data)
    except ValueError as exc:
        raise MessageError(f"model message is not valid JSON: {exc}") from None
    return validate_message(msg) if validate else msg
