"""Whole data sets as arrays: ``(X, y)``, ``X`` alone or a pandas DataFrame read into float
arrays (:func:`tabular`, :func:`as_floats`), as ``fit`` and ``PrivateLearner.learn_many`` take them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

import numpy as np
from numpy.typing import ArrayLike

from stream_vips.records.decoding import RawRecord


class DataFrameLike(Protocol):
    """A pandas DataFrame as :func:`tabular` reads it (by duck typing: pandas is not a dependency)."""

    @property
    def columns(self) -> Iterable[object]: ...

    def to_numpy(self, dtype: Any = ...) -> np.ndarray: ...


#: A whole data set, as ``fit`` and ``PrivateLearner.learn_many`` take it: record dicts or raw JSON
#: documents, ``(X, y)`` arrays, ``X`` alone, or a pandas DataFrame (:func:`tabular` reads the arrays).
DataSet: TypeAlias = (Iterable[Mapping[str, Any]] | Iterable[RawRecord] | tuple[ArrayLike, ArrayLike] | np.ndarray
                      | DataFrameLike)


def tabular(data: Any, *, x_columns: Sequence[str] | None = None,
            y_column: str | None = None) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``(X, y)`` of array data, ``None`` for records: ``(X, y)``, ``X`` alone (``y`` None) or a
    pandas DataFrame (``y_column``, default ``"y"`` when present; ``x_columns``, default all the
    other columns). The column count is public schema (replacing one row cannot change it).
    Data that cannot be read so is a :class:`~stream_vips.errors.DataError` naming the column or
    the shape, never a value (a value is a record's private content).

    >>> X, y = tabular((np.zeros((2, 3)), np.ones(2)))
    >>> X.shape, y.tolist(), tabular([{"x": [1.0]}])
    ((2, 3), [1.0, 1.0], None)
    >>> tabular(([{"x": [1.0]}], [{"x": [2.0]}]))
    Traceback (most recent call last):
    ...
    stream_vips.errors.DataError: wrong_type: a 2-tuple is read as (X, y) arrays, and X is not a numeric array ...
    """
    from stream_vips.errors import DataError

    if hasattr(data, "to_numpy") and hasattr(data, "columns"):  # a pandas DataFrame
        y_name = y_column if y_column is not None else ("y" if "y" in data.columns else None)
        cols = list(x_columns) if x_columns is not None else [c for c in data.columns if c != y_name]
        for name in [*cols, *([] if y_name is None else [y_name])]:
            if name not in data.columns:
                raise DataError(f"the DataFrame has no column {name!r} (x_columns / y_column name its columns)")
        try:
            X = as_floats(data[cols])
            data = X if y_name is None else (X, as_floats(data[y_name]))
        except (TypeError, ValueError):
            bad = next((c for c in [*cols, y_name] if c is not None and not _numeric(data[c])), None)
            raise DataError(f"wrong_type: DataFrame column {bad!r} is not numeric (every x and y column must be; "
                            "strings are refused, as in a record)") from None
    elif x_columns is not None or y_column is not None:
        raise DataError("x_columns and y_column apply to a pandas DataFrame only")
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        raise DataError(f"expected many records, not one {type(data).__name__} (each character would be a "
                        "record): pass a list of records, e.g. [{'x': [...], 'y': ...}] or a list of JSON bytes")
    if isinstance(data, tuple) and len(data) == 2:
        arrays = []
        for name, part in (("X", data[0]), ("y", data[1])):
            try:
                arrays.append(as_floats(part))
            except (TypeError, ValueError):
                raise DataError(f"wrong_type: a 2-tuple is read as (X, y) arrays, and {name} is not a numeric array "
                                "(strings are refused, as in a record): pass "
                                "records as a list, e.g. [{'x': [...], 'y': ...}], or numeric arrays shaped (n, d) "
                                "and (n,)") from None
        X, y = np.ascontiguousarray(arrays[0]), arrays[1]
        if X.ndim != 2 or y.shape != (X.shape[0],):
            raise DataError(f"(X, y) must be shaped (n, d) and (n,), got {X.shape} and {y.shape}")
        return X, y
    if isinstance(data, np.ndarray):
        if data.ndim != 2:
            raise DataError(f"X must be shaped (n, d), got {data.shape}")
        try:
            return np.ascontiguousarray(as_floats(data)), None
        except (TypeError, ValueError):
            raise DataError(f"wrong_type: X must be numeric, got an array of kind {data.dtype.kind!r}") from None
    return None


def _numeric(column: Any) -> bool:
    """Whether a DataFrame column converts to floats (only asked once a conversion failed)."""
    try:
        as_floats(column)
    except (TypeError, ValueError):
        return False
    return True


def as_floats(values: Any) -> np.ndarray:
    """``values`` (array-like or DataFrame) as a float array, per value as a JSON reader would.

    An integer too large for a double becomes +-inf, as its decimal text would in a JSON record,
    so that record alone is rejected later (like any non-finite value) instead of the whole data
    set failing with an OverflowError; complex values raise ``TypeError`` (numpy would silently
    drop their imaginary part), and so does anything else that is not a number.

    >>> as_floats(np.array([[1, -10**400], [10**400, 2]], dtype=object)).tolist()
    [[1.0, -inf], [inf, 2.0]]
    >>> as_floats(np.array([1 + 2j]))
    Traceback (most recent call last):
    ...
    TypeError: complex values are not real numbers
    """
    import warnings

    to_numpy = getattr(values, "to_numpy", None)
    _refuse_text(values)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", np.exceptions.ComplexWarning)
            return to_numpy(dtype=float) if to_numpy is not None else np.asarray(values, dtype=float)
    except np.exceptions.ComplexWarning:
        raise TypeError("complex values are not real numbers") from None
    except OverflowError:  # an int beyond the double range, in an object array (only then: the slow path)
        objects = to_numpy(dtype=object) if to_numpy is not None else np.asarray(values, dtype=object)
        return np.vectorize(_float_or_inf, otypes=[float])(objects)


def _refuse_text(values: Any) -> None:
    """Text is not a number, even text numpy would parse (``np.asarray(["1.5"], float)``): a
    record's JSON string value is ``wrong_type``, so an array or column of strings is too."""
    dtypes = getattr(values, "dtypes", None)
    dtype = getattr(values, "dtype", None)
    kinds = ({getattr(t, "kind", "O") for t in np.atleast_1d(dtypes)} if dtypes is not None
             else {dtype.kind} if isinstance(dtype, np.dtype) else {"O"})
    if kinds & {"U", "S"}:
        raise TypeError("wrong_type: strings are not numbers")
    if "O" in kinds:
        to_numpy = getattr(values, "to_numpy", None)
        objects = to_numpy(dtype=object) if to_numpy is not None else np.asarray(values, dtype=object)
        if objects.dtype.kind in "US" or any(isinstance(v, (str, bytes)) for v in objects.ravel().tolist()):
            raise TypeError("wrong_type: strings are not numbers")


def _float_or_inf(v: Any) -> float:
    """``float(v)``, or +-inf for an integer too large for a double."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf
