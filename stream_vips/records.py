"""Record validation shared by the model families: JSON decoding, reason codes, numeric fields.

A record that fails a check is rejected with one reason code (the first failed check, in field
order) and a human-readable detail; rejected records go to the dead-letter sink and never reach
the reservoir. The checks are vectorized: a field is converted for the whole batch with one
``np.asarray`` call, and only when that fails (a malformed record is present) does a per-record
pass run to find the culprits.

JSON booleans count as numbers (0/1), as they do in Python and numpy. Python's ``json`` reads the
non-standard literals ``NaN`` and ``Infinity``; they are rejected here as ``non_finite``.

Decoding uses ``orjson`` when it is installed (about 3x faster on small records) and Python's
``json`` for every document ``orjson`` refuses, so both accept exactly the same documents with the
same values (``NaN``, long integers, UTF-16 input, BOMs and non-``bytes`` input all go through
``json``), and every rejection detail is ``json``'s.

>>> batch = FieldBatch([{"x": [0.5, 1.0], "y": 2.0}, {"x": [1.0]}, "text"])
>>> x = batch.vector("x", 2, max_abs=1e6)
>>> y = batch.scalar("y", max_abs=1e6)
>>> batch.accepted().tolist(), [reason for _, reason, _ in batch.rejected()]
([0], ['wrong_shape', 'not_object'])
"""

from __future__ import annotations

import json
from itertools import chain
from typing import Any, NamedTuple, Sequence

import numpy as np

try:
    from orjson import loads as _fast_loads
except ImportError:  # optional speed-up: json alone gives the same results
    _fast_loads = json.loads
# orjson reads integers beyond 64 bits as floats (json keeps them exact, and validation rejects them
# as out_of_range): a document with a run of 19+ digits goes to json, as does anything but bytes.
# (Digits mapped to "0" and a substring test: several times faster than a regular expression.)
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19

INVALID_JSON = "invalid_json"
EMPTY_DOCUMENT = "empty_document"
TOO_LARGE = "too_large"
NOT_OBJECT = "not_object"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
WRONG_SHAPE = "wrong_shape"
NON_FINITE = "non_finite"
OUT_OF_RANGE = "out_of_range"

REASONS = (
    INVALID_JSON,
    EMPTY_DOCUMENT,
    TOO_LARGE,
    NOT_OBJECT,
    MISSING_FIELD,
    WRONG_TYPE,
    WRONG_SHAPE,
    NON_FINITE,
    OUT_OF_RANGE,
)

_NUMBER = (int, float, bool)
_NUMBER_SET = frozenset(_NUMBER)
_MISSING = object()


class RecordRejected(ValueError):
    """One record failed validation: ``reason`` is a code from :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Decoded(NamedTuple):
    """Decoded JSON values, their positions in the input, and the rejected positions."""

    values: list[Any]
    index: list[int]
    rejected: list[tuple[int, str, str]]


def _too_large(raw: bytes | str, max_bytes: int | None) -> RecordRejected | None:
    if max_bytes is not None and len(raw) > max_bytes:
        return RecordRejected(TOO_LARGE, f"record of {len(raw)} bytes exceeds the limit of {max_bytes}")
    return None


#: What a malformed document can raise: JSONDecodeError and UnicodeDecodeError are ValueErrors,
#: and json recurses once per nesting level, so a deeply nested document raises RecursionError.
_DECODE_ERRORS = (ValueError, TypeError, RecursionError)


def _decode_failure(raw: bytes | str, exc: Exception) -> RecordRejected:
    if isinstance(raw, (bytes, str)) and not raw.strip():
        return RecordRejected(EMPTY_DOCUMENT, "empty record")
    if isinstance(exc, RecursionError):
        return RecordRejected(INVALID_JSON, "document nested too deeply")
    return RecordRejected(INVALID_JSON, str(exc)[:200])


def decode_one(raw: bytes | str, max_bytes: int | None = None) -> Any:
    """Decode one JSON document or raise :class:`RecordRejected`."""
    too_large = _too_large(raw, max_bytes)
    if too_large is not None:
        raise too_large
    try:
        return _loads(raw)
    except _DECODE_ERRORS as exc:
        raise _decode_failure(raw, exc) from None


def _loads(raw: bytes | str) -> Any:
    """``orjson.loads`` where it accepts the document, else ``json.loads`` (which may raise)."""
    if type(raw) is bytes and _LONG_RUN not in raw.translate(_DIGITS_AS_ZERO):
        try:
            return _fast_loads(raw)
        except (ValueError, TypeError):
            pass
    return json.loads(raw)


def decode_json(raws: Sequence[bytes | str], max_bytes: int | None = None) -> Decoded:
    """Decode a batch of JSON documents; failures become ``(position, reason, detail)``."""
    if (_fast_loads is not json.loads and raws and set(map(type, raws)) == {bytes}
            and (max_bytes is None or max(map(len, raws)) <= max_bytes)
            and _LONG_RUN not in b"\n".join(raws).translate(_DIGITS_AS_ZERO)):
        try:  # the common batch: every document goes to orjson, which accepts them all
            return Decoded(list(map(_fast_loads, raws)), list(range(len(raws))), [])
        except (ValueError, TypeError):
            pass  # some document needs json or is rejected: decide record by record
    values: list[Any] = []
    index: list[int] = []
    rejected: list[tuple[int, str, str]] = []
    fast, digits_as_zero = _fast_loads, _DIGITS_AS_ZERO
    for i, raw in enumerate(raws):
        if max_bytes is not None and len(raw) > max_bytes:
            exc = _too_large(raw, max_bytes)
            rejected.append((i, exc.reason, exc.detail))
            continue
        try:  # _loads() inlined: this is the per-record hot path
            values.append(fast(raw) if type(raw) is bytes and _LONG_RUN not in raw.translate(digits_as_zero)
                          else json.loads(raw))
        except (ValueError, TypeError):
            try:
                values.append(json.loads(raw))
            except _DECODE_ERRORS as err:
                exc = _decode_failure(raw, err)
                rejected.append((i, exc.reason, exc.detail))
                continue
        index.append(i)
    return Decoded(values, index, rejected)


class FieldBatch:
    """Validates numeric fields of a batch of decoded records, one vectorized pass per field.

    Create it on the decoded values, call :meth:`vector` / :meth:`scalar` per field (in the order
    checks should apply), then read :meth:`accepted` and :meth:`rejected`. Arrays returned by the
    field methods have one row per input record; rows of rejected records hold zeros and must be
    dropped with ``array[batch.accepted()]``.
    """

    def __init__(self, objs: Sequence[Any]) -> None:
        self.objs = objs if isinstance(objs, list) else list(objs)
        self.n = len(self.objs)
        self._bad = np.zeros(self.n, dtype=bool)
        self._reasons: dict[int, tuple[str, str]] = {}
        not_obj = [i for i, o in enumerate(self.objs) if type(o) is not dict]
        for i in not_obj:
            self._reject(i, NOT_OBJECT, f"record is a JSON {_json_type(self.objs[i])}, expected an object")

    def _reject(self, i: int, reason: str, detail: str) -> None:
        if not self._bad[i]:
            self._bad[i] = True
            self._reasons[i] = (reason, detail)

    def _values(self, name: str) -> list[Any]:
        return [o.get(name, _MISSING) if type(o) is dict else _MISSING for o in self.objs]

    def _present(self, i: int, name: str, v: Any) -> bool:
        """Whether record ``i`` is still accepted and has field ``name`` (a missing one is rejected)."""
        if self._bad[i]:
            return False
        if v is _MISSING:
            self._reject(i, MISSING_FIELD, f"record has no {name!r} field")
            return False
        return True

    def _check_numbers(self, name: str, arr: np.ndarray, max_abs: float | None) -> None:
        flat = arr.reshape(self.n, int(np.prod(arr.shape[1:], dtype=np.int64)))
        finite = np.isfinite(flat).all(axis=1)
        for i in np.flatnonzero(~finite):
            self._reject(int(i), NON_FINITE, f"{name!r} contains NaN or infinity")
        if max_abs is not None:
            with np.errstate(invalid="ignore"):
                big = finite & (np.abs(flat) > max_abs).any(axis=1)
            for i in np.flatnonzero(big):
                self._reject(int(i), OUT_OF_RANGE, f"{name!r} has a value beyond +-{max_abs:g}")

    def vector(self, name: str, dim: int, *, max_abs: float | None = None) -> np.ndarray:
        """Field ``name`` as an (n, dim) float64 array of finite numbers with |value| <= max_abs."""
        vals = self._values(name)
        arr = _numeric_rows(vals, dim)
        if arr is None:
            arr = self._slow_vector(name, vals, dim)
        arr[self._bad] = 0.0
        self._check_numbers(name, arr, max_abs)
        arr[self._bad] = 0.0
        return arr

    def scalar(self, name: str, *, max_abs: float | None = None) -> np.ndarray:
        """Field ``name`` as an (n,) float64 array of finite numbers with |value| <= max_abs."""
        vals = self._values(name)
        arr = _numeric_scalars(vals)
        if arr is None:
            arr = np.zeros(self.n)
            for i, v in enumerate(vals):
                if not self._present(i, name, v):
                    continue
                if type(v) not in _NUMBER:
                    self._reject(i, WRONG_TYPE, f"{name!r} must be a number, got {_json_type(v)}")
                else:
                    arr[i] = self._float(i, name, v)
        arr[self._bad] = 0.0
        self._check_numbers(name, arr, max_abs)
        arr[self._bad] = 0.0
        return arr

    def binary(self, name: str, *, max_abs: float | None = None) -> np.ndarray:
        """Field ``name`` as an (n,) float64 array of labels 0 or 1; other numbers are out of range.

        >>> batch = FieldBatch([{"y": 1}, {"y": 0.5}, {"y": False}])
        >>> batch.binary("y").tolist(), [(i, reason) for i, reason, _ in batch.rejected()]
        ([1.0, 0.0, 0.0], [(1, 'out_of_range')])
        """
        y = self.scalar(name, max_abs=max_abs)
        for i in np.flatnonzero(~self._bad & (y != 0.0) & (y != 1.0)):
            self._reject(int(i), OUT_OF_RANGE, f"{name!r} must be 0 or 1, got {y[i]:g}")
        y[self._bad] = 0.0
        return y

    def _slow_vector(self, name: str, vals: list[Any], dim: int) -> np.ndarray:
        """The batch has a malformed record: classify shapes per record, convert the rest at once."""
        arr = np.zeros((self.n, dim))
        shaped = []
        for i, v in enumerate(vals):
            if not self._present(i, name, v):
                continue
            if type(v) is not list:
                self._reject(i, WRONG_TYPE, f"{name!r} must be an array of {dim} numbers, got {_json_type(v)}")
            elif len(v) != dim:
                self._reject(i, WRONG_SHAPE, f"{name!r} has {len(v)} entries, expected {dim}")
            else:
                shaped.append(i)
        numeric = []
        for i in shaped:
            v = vals[i]
            if all(type(e) in _NUMBER for e in v):
                numeric.append(i)
            else:
                kind = next(_json_type(e) for e in v if type(e) not in _NUMBER)
                self._reject(i, WRONG_TYPE, f"{name!r} must contain only numbers, found {kind}")
        sub = _numeric_rows([vals[i] for i in numeric], dim)
        if sub is not None:
            arr[numeric] = sub
        else:  # integers beyond float range
            for i in numeric:
                arr[i] = [self._float(i, name, e) for e in vals[i]]
        return arr

    def _float(self, i: int, name: str, v: Any) -> float:
        try:
            return float(v)
        except OverflowError:  # an integer beyond float range
            self._reject(i, OUT_OF_RANGE, f"{name!r} has an integer too large for a float")
            return 0.0

    def accepted(self) -> np.ndarray:
        """Indices (into the input list) of records that passed every check so far."""
        return np.flatnonzero(~self._bad)

    def rejected(self) -> list[tuple[int, str, str]]:
        """``(index, reason, detail)`` for every rejected record, by index."""
        return [(i, *self._reasons[i]) for i in sorted(self._reasons)]


def _numeric_rows(vals: list[Any], dim: int) -> np.ndarray | None:
    """(n, dim) floats when every value is a list of ``dim`` numbers; else None.

    The type checks run at C speed (``map``/``set``) and ``np.asarray`` runs only on numbers: on
    a string it would first convert every number of the batch to text.
    """
    if not vals:
        return np.zeros((0, dim))
    if set(map(type, vals)) != {list} or set(map(len, vals)) != {dim}:
        return None
    if dim and not set(map(type, chain.from_iterable(vals))) <= _NUMBER_SET:
        return None
    try:
        return np.asarray(vals, dtype=np.float64).reshape(len(vals), dim)
    except (OverflowError, ValueError, TypeError):
        return None


def _numeric_scalars(vals: list[Any]) -> np.ndarray | None:
    """(n,) floats when every value is a number; else None."""
    if not set(map(type, vals)) <= _NUMBER_SET:
        return None
    try:
        return np.asarray(vals, dtype=np.float64).reshape(len(vals))
    except (OverflowError, ValueError, TypeError):
        return None


def _json_type(v: Any) -> str:
    if v is _MISSING:
        return "missing value"
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number"
    )
