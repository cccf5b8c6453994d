"""Validation of numeric fields of decoded records, vectorized over a batch (:class:`FieldBatch`).

The checks are vectorized: a field is converted for the whole batch with one ``np.asarray``
call; when a malformed record is present, C-level passes (``map`` over the batch into numpy
masks) find the culprits, the good rows are still converted in one call, and only the rejected
records get a per-record detail.

JSON ``true``/``false`` are not numbers: wherever a number is expected (a scalar, a vector's
entries, a binary label) they are rejected as ``wrong_type``, although Python and numpy would read
them as 1/0; labels are the numbers 0 and 1. Python's ``json`` reads the non-standard literals
``NaN`` and ``Infinity``; they are rejected here as ``non_finite``.

>>> batch = FieldBatch([{"x": [0.5, 1.0], "y": 2.0}, {"x": [1.0]}, "text"])
>>> x = batch.vector("x", 2, max_abs=1e6)
>>> y = batch.scalar("y", max_abs=1e6)
>>> batch.accepted().tolist(), [reason for _, reason, _ in batch.rejected()]
([0], ['wrong_shape', 'not_object'])
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import chain, repeat
from typing import Any

import numpy as np

from stream_vips.records.reasons import (
    MISSING_FIELD,
    NON_FINITE,
    NOT_OBJECT,
    OUT_OF_RANGE,
    WRONG_SHAPE,
    WRONG_TYPE,
)

#: JSON numbers decode to exactly these types; ``bool`` (an ``int`` subclass) is deliberately absent.
_NUMBER = (int, float)
_NUMBER_SET = frozenset(_NUMBER)
_LIST = frozenset((list,))
_MISSING = object()


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
        self._dicts = self.objs  # the records, non-objects replaced by {} so field lookups run in C
        types = list(map(type, self.objs))
        if set(types) - {dict}:
            is_dict = np.fromiter(map(operator.is_, types, repeat(dict)), dtype=bool, count=self.n)
            self._dicts = list(self.objs)
            for i in np.flatnonzero(~is_dict).tolist():
                self._reject(i, NOT_OBJECT, f"record is a JSON {_json_type(self.objs[i])}, expected an object")
                self._dicts[i] = {}

    def _reject(self, i: int, reason: str, detail: str) -> None:
        if not self._bad[i]:
            self._bad[i] = True
            self._reasons[i] = (reason, detail)

    def _values(self, name: str) -> list[Any]:
        return list(map(dict.get, self._dicts, repeat(name), repeat(_MISSING)))

    def _classify(self, name: str, vals: list[Any], allowed: frozenset[type], expected: str) -> np.ndarray:
        """Reject live records whose field is missing or not of an ``allowed`` type (masks built
        in C; details per rejected record); returns the mask of live records that passed."""
        n = self.n
        missing = np.fromiter(map(operator.is_, vals, repeat(_MISSING)), dtype=bool, count=n)
        typed = np.fromiter(map(allowed.__contains__, map(type, vals)), dtype=bool, count=n)
        live = ~self._bad
        for i in np.flatnonzero(live & missing).tolist():
            self._reject(i, MISSING_FIELD, f"record has no {name!r} field")
        for i in np.flatnonzero(live & ~missing & ~typed).tolist():
            self._reject(i, WRONG_TYPE, f"{name!r} must be {expected}, got {_json_type(vals[i])}")
        return live & typed

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
        if arr is None:  # a malformed record: classify in C, convert the numbers at once
            arr = np.zeros(self.n)
            numeric = np.flatnonzero(self._classify(name, vals, _NUMBER_SET, "a number"))
            self._convert(name, arr, numeric, vals)
        arr[self._bad] = 0.0
        self._check_numbers(name, arr, max_abs)
        arr[self._bad] = 0.0
        return arr

    def binary(self, name: str, *, max_abs: float | None = None) -> np.ndarray:
        """Field ``name`` as an (n,) float64 array of labels 0 or 1; other numbers are out of range,
        and ``true``/``false`` are wrong_type (a label is a number, as documented for records).

        >>> batch = FieldBatch([{"y": 1}, {"y": 0.5}, {"y": False}, {"y": 0.0}])
        >>> batch.binary("y").tolist(), [(i, reason) for i, reason, _ in batch.rejected()]
        ([1.0, 0.0, 0.0, 0.0], [(1, 'out_of_range'), (2, 'wrong_type')])
        """
        y = self.scalar(name, max_abs=max_abs)
        for i in np.flatnonzero(~self._bad & (y != 0.0) & (y != 1.0)):
            self._reject(int(i), OUT_OF_RANGE, f"{name!r} must be 0 or 1, got {y[i]:g}")
        y[self._bad] = 0.0
        return y

    def _slow_vector(self, name: str, vals: list[Any], dim: int) -> np.ndarray:
        """The batch has a malformed record: type, length and element checks run as C-level
        passes over the batch; only rejected records get a per-record detail."""
        arr = np.zeros((self.n, dim))
        lists = np.flatnonzero(self._classify(name, vals, _LIST, f"an array of {dim} numbers"))
        rows = list(map(vals.__getitem__, lists.tolist()))
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        for j in np.flatnonzero(lengths != dim).tolist():
            self._reject(int(lists[j]), WRONG_SHAPE, f"{name!r} has {lengths[j]} entries, expected {dim}")
        shaped = np.flatnonzero(lengths == dim)
        if shaped.size < len(rows):
            rows = list(map(rows.__getitem__, shaped.tolist()))
        if dim and rows and not set(map(type, chain.from_iterable(rows))) <= _NUMBER_SET:
            flat = chain.from_iterable(rows)
            numbers = np.fromiter(map(_NUMBER_SET.__contains__, map(type, flat)), dtype=bool,
                                  count=len(rows) * dim).reshape(len(rows), dim).all(axis=1)
            for j in np.flatnonzero(~numbers).tolist():
                kind = next(_json_type(e) for e in rows[j] if type(e) not in _NUMBER)
                self._reject(int(lists[shaped[j]]), WRONG_TYPE, f"{name!r} must contain only numbers, found {kind}")
            shaped = shaped[numbers]
        self._convert(name, arr, lists[shaped], vals)
        return arr

    def _convert(self, name: str, arr: np.ndarray, idx: np.ndarray, vals: list[Any]) -> None:
        """``arr[idx] = vals[idx]`` as floats in one call; record by record only when an integer
        is beyond float range (it is rejected as out_of_range)."""
        if not idx.size:
            return
        sub = list(map(vals.__getitem__, idx.tolist()))
        try:
            arr[idx] = np.asarray(sub, dtype=np.float64).reshape((idx.size, *arr.shape[1:]))
        except (OverflowError, ValueError, TypeError):
            for i, v in zip(idx.tolist(), sub):
                arr[i] = [self._float(i, name, e) for e in v] if type(v) is list else self._float(i, name, v)

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
