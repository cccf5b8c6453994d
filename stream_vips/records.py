"""Record validation shared by the model families: JSON decoding, reason codes, numeric fields.

A record that fails a check is rejected with one reason code (the first failed check, in field
order) and a human-readable detail; rejected records go to the dead-letter sink and never reach
the reservoir. The checks are vectorized: a field is converted for the whole batch with one
``np.asarray`` call; when a malformed record is present, C-level passes (``map`` over the batch
into numpy masks) find the culprits, the good rows are still converted in one call, and only the
rejected records get a per-record detail.

JSON ``true``/``false`` are not numbers: wherever a number is expected (a scalar, a vector's
entries, a binary label) they are rejected as ``wrong_type``, although Python and numpy would read
them as 1/0; labels are the numbers 0 and 1. Python's ``json`` reads the non-standard literals
``NaN`` and ``Infinity``; they are rejected here as ``non_finite``.

Decoding uses ``orjson`` when it is installed (several times faster on small records) and Python's
``json`` for every document ``orjson`` refuses, so both accept exactly the same documents with the
same values (``NaN``, long integers, UTF-16 input, BOMs and non-``bytes`` input all go through
``json``), and every rejection detail is ``json``'s. A batch is decoded by ``orjson`` in one pass
that skips the documents it refuses; only those take the per-document ``json`` path.

>>> batch = FieldBatch([{"x": [0.5, 1.0], "y": 2.0}, {"x": [1.0]}, "text"])
>>> x = batch.vector("x", 2, max_abs=1e6)
>>> y = batch.scalar("y", max_abs=1e6)
>>> batch.accepted().tolist(), [reason for _, reason, _ in batch.rejected()]
([0], ['wrong_shape', 'not_object'])
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, Protocol, TypeAlias, TypeGuard, cast

import numpy as np
from numpy.typing import ArrayLike

try:
    from orjson import loads as _fast_loads
except ImportError:  # optional speed-up: json alone gives the same results
    _fast_loads = json.loads  # type: ignore[assignment]  # json.loads takes what orjson.loads takes, and more
# orjson reads integers beyond 64 bits as floats (json keeps them exact, and validation rejects them
# as out_of_range): a document with a run of 19+ digits that is not a fraction goes to json, as does
# anything but bytes. (Digits mapped to "0" and substring counts: several times faster than a
# regular expression.)
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19
_FRACTION_RUN = b"." + _LONG_RUN
_DOT = ord(".")

INVALID_JSON = "invalid_json"
#: A record with no value at all (a Kafka tombstone: compaction and any producer can make one).
TOMBSTONE = "tombstone"
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
    TOMBSTONE,
    EMPTY_DOCUMENT,
    TOO_LARGE,
    NOT_OBJECT,
    MISSING_FIELD,
    WRONG_TYPE,
    WRONG_SHAPE,
    NON_FINITE,
    OUT_OF_RANGE,
)

#: JSON numbers decode to exactly these types; ``bool`` (an ``int`` subclass) is deliberately absent.
_NUMBER = (int, float)
_NUMBER_SET = frozenset(_NUMBER)
_LIST = frozenset((list,))
_MISSING = object()


class RecordRejected(ValueError):
    """One record failed validation: ``reason`` is a code from :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Decoded:
    """Decoded JSON values, their positions in the input, and the rejected positions."""

    values: list[Any]
    index: list[int]
    rejected: list[tuple[int, str, str]]


#: One record as a source delivers it: a JSON document (bytes or text), or ``None`` for a record
#: without a value (a Kafka tombstone).
RawRecord: TypeAlias = bytes | str | None


class DataFrameLike(Protocol):
    """A pandas DataFrame as :func:`tabular` reads it (by duck typing: pandas is not a dependency)."""

    @property
    def columns(self) -> Iterable[object]: ...

    def to_numpy(self, dtype: Any = ...) -> np.ndarray: ...


#: A whole data set, as ``fit`` and ``PrivateLearner.learn_many`` take it: record dicts or raw JSON
#: documents, ``(X, y)`` arrays, ``X`` alone, or a pandas DataFrame (:func:`tabular` reads the arrays).
DataSet: TypeAlias = (Iterable[Mapping[str, Any]] | Iterable[RawRecord] | tuple[ArrayLike, ArrayLike] | np.ndarray
                      | DataFrameLike)


def undecoded(values: Sequence[object]) -> TypeGuard[Sequence[RawRecord]]:
    """Whether a batch holds raw documents (bytes or text, ``None`` for a record without a value)
    rather than decoded records; a batch is one or the other, so its first item tells.

    >>> undecoded([None, b"{}"]), undecoded([{"x": [1.0]}]), undecoded([])
    (True, False, False)
    """
    return bool(len(values)) and (values[0] is None or isinstance(values[0], (bytes, bytearray, str)))


def _refused_unread(raw: bytes | str | None, max_bytes: int | None) -> RecordRejected | None:
    """Why ``raw`` is refused before it is parsed (no value at all, or too large), or ``None``."""
    if raw is None:
        return RecordRejected(TOMBSTONE, "the record has no value (a tombstone)")
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


def decode_one(raw: bytes | str | None, max_bytes: int | None = None) -> Any:
    """Decode one JSON document or raise :class:`RecordRejected` (``None``, a record without a
    value, is rejected as ``tombstone``)."""
    refused = _refused_unread(raw, max_bytes)
    if refused is not None:
        raise refused
    document = cast("bytes | str", raw)  # a None was refused above
    try:
        return _loads(document)
    except _DECODE_ERRORS as exc:
        raise _decode_failure(document, exc) from None


def _loads(raw: bytes | str) -> Any:
    """``orjson.loads`` where it accepts the document, else ``json.loads`` (which may raise)."""
    if type(raw) is bytes and _no_long_integer(raw.translate(_DIGITS_AS_ZERO)):
        try:
            return _fast_loads(raw)
        except (ValueError, TypeError):
            pass
    return json.loads(raw)


def _no_long_integer(text: bytes) -> bool:
    """No 19+ digit run but fractions of fewer than 38 digits in ``text`` (digits mapped to 0)."""
    return text.count(_LONG_RUN) == text.count(_FRACTION_RUN)


def decode_json(raws: Sequence[bytes | str | None], max_bytes: int | None = None) -> Decoded:
    """Decode a batch of JSON documents; failures become ``(position, reason, detail)``.

    The results are those of :func:`decode_one` applied to each document alone. Documents that
    ``orjson`` may read (bytes, within ``max_bytes``, no long integer) go through it in one
    C-level pass that resumes after each document it refuses; only the refused and the excluded
    documents take the per-document ``json`` path, so a few bad records in a large batch cost
    about what they would alone instead of slowing down the whole batch.
    """
    n = len(raws)
    if _fast_loads is json.loads or not n:
        return _decode_reference(raws, range(n), max_bytes)
    fast = _orjson_candidates(raws, max_bytes)
    fast_idx = np.flatnonzero(fast)
    docs = raws if fast_idx.size == n else list(map(raws.__getitem__, fast_idx.tolist()))
    values, failed = _orjson_resuming(cast("Sequence[bytes]", docs))  # the candidates are bytes
    slow = np.flatnonzero(~fast)
    if failed:
        keep = np.ones(fast_idx.size, dtype=bool)
        keep[failed] = False
        slow = np.union1d(slow, fast_idx[failed])
        fast_idx = fast_idx[keep]
    if not slow.size:
        return Decoded(values, fast_idx.tolist(), [])
    rescued = _decode_reference(raws, slow.tolist(), max_bytes)
    if not rescued.index:
        return Decoded(values, fast_idx.tolist(), rescued.rejected)
    # json accepted some documents orjson refused (NaN, long integers, ...): merge by position
    index = np.concatenate([fast_idx, np.asarray(rescued.index, dtype=fast_idx.dtype)])
    order = np.argsort(index, kind="stable")
    merged = values + rescued.values
    return Decoded(list(map(merged.__getitem__, order.tolist())), index[order].tolist(), rescued.rejected)


def _orjson_candidates(raws: Sequence[Any], max_bytes: int | None) -> np.ndarray:
    """Mask of the documents ``orjson`` may decode: bytes, within ``max_bytes``, no long integer.

    orjson reads integers beyond 64 bits as floats where json keeps them exact, so a digit run of
    19 or more that is not a fraction (directly after a ``.``) sends its document to json. Long
    fractions are safe: orjson rounds them exactly as ``float()`` does. One translate of the
    joined batch and two substring counts decide for the whole batch; only a batch with a
    suspicious run locates it.
    """
    n = len(raws)
    types = list(map(type, raws))
    if set(types) == {bytes}:
        ok, docs = np.ones(n, dtype=bool), raws
    else:  # str, bytearray, ...: json decides these
        ok = np.fromiter(map(operator.is_, types, repeat(bytes)), dtype=bool, count=n)
        docs = list(raws)
        for i in np.flatnonzero(~ok).tolist():
            docs[i] = b""
    if max_bytes is not None:
        big = np.fromiter(map(len, docs), dtype=np.int64, count=n) > max_bytes
        if big.any():
            ok &= ~big
            docs = list(docs)
            for i in np.flatnonzero(big).tolist():
                docs[i] = b""
    text = b"\n".join(docs).translate(_DIGITS_AS_ZERO)
    if not _no_long_integer(text):
        ok &= ~_long_integer_documents(text, docs)
    return ok


def _long_integer_documents(text: bytes, docs: Sequence[bytes]) -> np.ndarray:
    """Mask of documents holding a 19+ digit run not directly after ``.`` (``text``: the joined
    batch with every digit mapped to ``0``). A fraction of 38+ digits counts too (conservative)."""
    hits = []
    pos = text.find(_LONG_RUN)
    while pos >= 0:  # one step per long run in the batch, not per document
        if pos == 0 or text[pos - 1] != _DOT:
            hits.append(pos)
        pos = text.find(_LONG_RUN, pos + len(_LONG_RUN))
    ends = np.cumsum(np.fromiter(map(len, docs), dtype=np.int64, count=len(docs)) + 1)
    mask = np.zeros(len(docs), dtype=bool)
    mask[np.searchsorted(ends, np.asarray(hits, dtype=np.int64), side="right")] = True
    return mask


def _orjson_resuming(docs: Sequence[bytes]) -> tuple[list[Any], list[int]]:
    """orjson over ``docs``: the decoded values and the positions it refused, in order.

    ``list.extend(map(...))`` runs at C speed and keeps what it appended before an exception,
    so after a refusal the same iterator resumes with the next document. Should an interpreter
    drop the partial items, the counts disagree and a plain loop decides instead.
    """
    loads = _fast_loads
    values: list[Any] = []
    failed: list[int] = []
    it = iter(docs)
    while True:
        try:
            values.extend(map(loads, it))
            break
        except (ValueError, TypeError):
            failed.append(len(values) + len(failed))
    if len(values) + len(failed) == len(docs):
        return values, failed
    values, failed = [], []  # pragma: no cover - CPython keeps the partial items
    for i, raw in enumerate(docs):
        try:
            values.append(loads(raw))
        except (ValueError, TypeError):
            failed.append(i)
    return values, failed


def _decode_reference(raws: Sequence[Any], positions: Sequence[int] | range, max_bytes: int | None) -> Decoded:
    """The per-document path: :func:`decode_one` on each position, failures collected."""
    values: list[Any] = []
    index: list[int] = []
    rejected: list[tuple[int, str, str]] = []
    for i in positions:
        try:
            values.append(decode_one(raws[i], max_bytes))
        except RecordRejected as exc:
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
    stream_vips.errors.DataError: a 2-tuple is read as (X, y) arrays, and X is not a numeric array: pass ...
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
            raise DataError(f"DataFrame column {bad!r} is not numeric (every x and y column must be)") from None
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
                raise DataError(f"a 2-tuple is read as (X, y) arrays, and {name} is not a numeric array: pass "
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
            raise DataError(f"X must be numeric, got an array of kind {data.dtype.kind!r}") from None
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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", np.exceptions.ComplexWarning)
            return to_numpy(dtype=float) if to_numpy is not None else np.asarray(values, dtype=float)
    except np.exceptions.ComplexWarning:
        raise TypeError("complex values are not real numbers") from None
    except OverflowError:  # an int beyond the double range, in an object array (only then: the slow path)
        objects = to_numpy(dtype=object) if to_numpy is not None else np.asarray(values, dtype=object)
        return np.vectorize(_float_or_inf, otypes=[float])(objects)


def _float_or_inf(v: Any) -> float:
    """``float(v)``, or +-inf for an integer too large for a double."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def top_reasons(counts: Mapping[str, int], k: int = 3) -> str:
    """The ``k`` most common rejection reasons with their counts, for one line (public counts).

    >>> import collections
    >>> top_reasons(collections.Counter({"wrong_shape": 4, "invalid_json": 9, "empty_document": 1}), 2)
    'invalid_json (9), wrong_shape (4)'
    """
    from collections import Counter

    return ", ".join(f"{reason} ({count})" for reason, count in Counter(counts).most_common(k))
