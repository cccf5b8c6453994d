"""JSON decoding of raw records, one document or a whole batch; a document that cannot be read is
rejected (``tombstone``, ``too_large``, ``empty_document``, ``invalid_json``).

Decoding uses ``orjson`` when it is installed (several times faster on small records) and Python's
``json`` for every document ``orjson`` refuses, so both accept exactly the same documents with the
same values (``NaN``, long integers, UTF-16 input, BOMs and non-``bytes`` input all go through
``json``), and every rejection detail is ``json``'s. A batch is decoded by ``orjson`` in one pass
that skips the documents it refuses; only those take the per-document ``json`` path.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeAlias, TypeGuard, cast

import numpy as np

from stream_vips.records.reasons import EMPTY_DOCUMENT, INVALID_JSON, TOMBSTONE, TOO_LARGE, RecordRejected

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


@dataclass(frozen=True)
class Decoded:
    """Decoded JSON values, their positions in the input, and the rejected positions."""

    values: list[Any]
    index: list[int]
    rejected: list[tuple[int, str, str]]


#: One record as a source delivers it: a JSON document (bytes or text), or ``None`` for a record
#: without a value (a Kafka tombstone).
RawRecord: TypeAlias = bytes | str | None


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
