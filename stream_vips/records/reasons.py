"""Rejection reason codes: a record that fails a check is rejected with one reason code (the
first failed check, in field order) and a human-readable detail; rejected records go to the
dead-letter sink and never reach the reservoir.
"""

from __future__ import annotations

from collections.abc import Mapping

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


class RecordRejected(ValueError):
    """One record failed validation: ``reason`` is a code from :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def top_reasons(counts: Mapping[str, int], k: int = 3) -> str:
    """The ``k`` most common rejection reasons with their counts, for one line (public counts).

    >>> import collections
    >>> top_reasons(collections.Counter({"wrong_shape": 4, "invalid_json": 9, "empty_document": 1}), 2)
    'invalid_json (9), wrong_shape (4)'
    """
    from collections import Counter

    return ", ".join(f"{reason} ({count})" for reason, count in Counter(counts).most_common(k))
