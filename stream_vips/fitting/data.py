"""The data of ``fit``: arrays, DataFrames and records as the records a learner takes, and the
public dimension d (never read from a record)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from stream_vips.errors import FitError
from stream_vips.fitting.rules import MAX_DIM, PYTHON_NAMES
from stream_vips.models import model_class
from stream_vips.records import DataSet

# ------------------------------------------------------------------------------------------ data


def _dumps(obj: Any) -> bytes:
    try:
        import orjson

        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except ImportError:  # pragma: no cover - orjson is a dependency, json is the fallback
        return json.dumps(obj, default=_numpy_to_list).encode()


def _numpy_to_list(obj: Any) -> Any:
    """``json.dumps``'s ``default``: numpy arrays and scalars as lists and numbers."""
    if isinstance(obj, (np.ndarray, np.generic)):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


#: The line a record that is not JSON becomes: invalid JSON, so the run rejects that record alone
#: (counted as invalid_json, like a malformed line of a file) and names none of its values.
UNENCODABLE_RECORD = b"<a record that is not JSON>"


def _encode_record(rec: Any) -> bytes:
    """One record dict as its JSON line (NaN and infinity as the tokens ``NaN`` and ``Infinity``,
    rejected later as ``non_finite``, as in a file). What orjson refuses (an integer beyond 64 bits, a
    non-string key, a lone surrogate) is written by ``json`` as the same record's text would be
    in a file; what is not JSON at all (a set, a cycle) becomes :data:`UNENCODABLE_RECORD`."""
    try:
        line = _dumps(rec)
        if b"null" not in line:
            return line
        # orjson writes NaN and infinity as null, which the record check would call wrong_type; json
        # keeps them as NaN / Infinity, which it rejects as non_finite, as in a file (and keeps null)
        return json.dumps(rec, default=_numpy_to_list).encode()
    except (TypeError, ValueError, OverflowError, RecursionError):
        try:
            return json.dumps(rec, default=_numpy_to_list).encode()
        except (TypeError, ValueError, OverflowError, RecursionError):
            return UNENCODABLE_RECORD


def encode_records(data: DataSet, *, x_columns: Sequence[str] | None = None, y_column: str | None = None,
                   field: str = "x") -> tuple[list[bytes] | list[dict[str, Any]], int | None]:
    """The data as the records a learner takes, one per arrival, and d when the data's shape
    fixes it: the rows of arrays and DataFrames as record dicts of plain lists and numbers
    (no JSON in between), and records given one by one (dicts, JSON lines) as JSON lines (bytes),
    so a dict record meets exactly the checks its line in a file would (one answer per input,
    whichever door it comes through).

    ``data``: a list/iterable of dicts (or of bytes or str lines), numpy ``(X, y)`` or ``X``, or
    a pandas DataFrame (``y_column``, default ``"y"`` when present; ``x_columns``, default all
    the other columns; :func:`stream_vips.records.tabular`). A lone X (array, or a DataFrame
    without y) fills the record ``field``: the family's vector (``x``, or ``y`` for sbn's images).
    For arrays and DataFrames d is the number of columns of X, part of the schema (replacing one
    row cannot change it); records carry no such schema, so d is ``None`` and must be given
    (:func:`fit`'s ``dim``).

    >>> records, d = encode_records((np.zeros((2, 3)), np.ones(2)))
    >>> records[0], d
    ({'x': [0.0, 0.0, 0.0], 'y': 1.0}, 3)
    >>> encode_records([{"x": [1, 2]}])
    ([b'{"x":[1,2]}'], None)
    >>> encode_records(np.array([[0, 1, 1]]), field="y")[0]
    [{'y': [0.0, 1.0, 1.0]}]
    """
    from stream_vips.errors import DataError
    from stream_vips.records import tabular

    try:
        arrays = tabular(data, x_columns=x_columns, y_column=y_column)
    except DataError as exc:  # fit's errors are FitError (docs/fit.md); the message names no value
        raise FitError(str(exc)) from None
    if arrays is not None:  # records straight from the arrays' rows: no JSON in between
        X, y = arrays
        rows = X.tolist()
        if y is None:
            return [{field: xi} for xi in rows], X.shape[1]
        return [{"x": xi, "y": yi} for xi, yi in zip(rows, y.tolist())], X.shape[1]
    try:
        records = iter(cast("Iterable[object]", data))  # not array data: records, or refused here
    except TypeError:
        raise FitError(f"fit reads records (a list of dicts or JSON lines), (X, y) arrays, X or a DataFrame, not "
                       f"{type(data).__name__}") from None
    out = []
    for rec in records:
        if isinstance(rec, (bytes, bytearray)):
            out.append(bytes(rec))
        elif isinstance(rec, str):
            out.append(rec.encode("utf-8", "surrogatepass"))  # a lone surrogate: read as json reads it
        else:
            out.append(_encode_record(rec))
    return out, None


def check_json_objects(encoded: Sequence[bytes]) -> None:
    """Refuse data in which no record is a JSON object: a JSON array file, pretty-printed JSON
    or CSV read as JSON Lines. (A refusal on form alone: such data have no valid record, so no
    model could come out of them; nothing is spent.)"""
    for raw in encoded:
        if raw.lstrip()[:1] == b"{":
            try:
                if isinstance(json.loads(raw), dict):
                    return
            except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
                continue
    raise FitError("fit reads JSON Lines (one JSON object per line), and no record is a JSON object: a JSON "
                   "array, pretty-printed JSON or CSV must be converted first")


def resolve_dim(family: str, dim: int | None, model_params: dict[str, Any], shape_d: int | None,
                names: Mapping[str, str] = PYTHON_NAMES) -> int:
    """The public dimension d: ``dim``, the family's dimension parameter in ``model_params``
    (``dim``, or ``n_visible`` for sbn, where ``dim`` is taken as ``n_visible`` and removed from
    ``model_params``; for lda the size of its ``vocabulary``, which is then required) or the
    data's shape, which must agree; at most :data:`MAX_DIM`.

    Never read from a record: under replace-one adjacency a record's content must not decide
    the released dimension, nor which other records are valid (docs/fit.md, "What is private
    and what is public").

    >>> resolve_dim("sbn", None, {"dim": 10}, None), resolve_dim("logistic", None, {}, 3)
    (10, 3)
    >>> resolve_dim("lda", None, {"vocabulary": ["apple", "pear"]}, None)
    2
    """
    cls = model_class(family)
    field_name, param = cls.record_field, cls.dim_param
    given = [dim, model_params.get(param)]
    if cls.dimension_of is not None:
        if param not in model_params:
            raise FitError(f"fit needs the {family} {param}, whose size is the dimension d: pass "
                           f"{names['give'].format(param)} (d alone does not give it)")
        try:
            given[1] = cls.dimension_of(model_params[param])
        except (TypeError, ValueError) as exc:
            raise FitError(f"{names['param']}: {exc}") from None
    if param != "dim":
        given.append(model_params.pop("dim", None))
    values = set()
    for value in given:
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer)) or not math.isfinite(value)
                or int(value) != value):
            raise FitError(f"the dimension ({names['dim']}) must be a positive integer, got {value!r}")
        values.add(int(value))
    if shape_d is not None and values and values != {shape_d}:
        raise FitError(f"the data have {shape_d} columns but the dimension is given as {sorted(values)[0]}")
    if shape_d is not None:
        values = {shape_d}
    if len(values) > 1:
        raise FitError(f"the dimension is given twice, as {' and '.join(map(str, sorted(values)))}")
    if not values:
        raise FitError(f"fit needs the dimension d of the records: pass {names['dim']} (the length of each "
                       f"record's {field_name!r}, the model parameter {param}); under replace-one adjacency d is "
                       "public, so it is never read from the data")
    (d,) = values
    if not 1 <= d <= MAX_DIM:
        raise FitError(f"the dimension must be between 1 and {MAX_DIM:,}, got {d:,}")
    return d
