"""Record decoding and numeric field validation shared by model families."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_vips import records
from stream_vips.records import FieldBatch, RecordRejected, decode_json, decode_one


def test_decode_json_reasons_and_positions():
    raws = [b'{"x": 1}', b"{not json", b"", b"   \n", b'{"a": "' + b"z" * 100 + b'"}', b"\xff\xfe{",
            b"[1, 2]", "{\"s\": 1}"]
    dec = decode_json(raws, max_bytes=64)
    assert dec.index == [0, 6, 7]
    assert dec.values == [{"x": 1}, [1, 2], {"s": 1}]
    assert [(i, r) for i, r, _ in dec.rejected] == [
        (1, "invalid_json"), (2, "empty_document"), (3, "empty_document"), (4, "too_large"), (5, "invalid_json")]
    assert "64" in dec.rejected[3][2]


def test_decode_one_raises_record_rejected():
    with pytest.raises(RecordRejected) as info:
        decode_one(b"[1,")
    assert info.value.reason == "invalid_json"
    assert decode_one(b'{"x": NaN}')["x"] != decode_one(b'{"x": NaN}')["x"]  # decoded; rejected later
    with pytest.raises(ValueError, match="unknown rejection reason"):
        RecordRejected("bad_reason", "x")


def test_nan_literal_is_rejected_as_non_finite():
    dec = decode_json([b'{"x": [NaN, 1.0]}', b'{"x": [Infinity, 1.0]}', b'{"x": [1.0, 2.0]}'])
    batch = FieldBatch(dec.values)
    batch.vector("x", 2)
    assert batch.accepted().tolist() == [2]
    assert [r for _, r, _ in batch.rejected()] == ["non_finite", "non_finite"]


def test_first_failed_check_wins_in_field_order():
    batch = FieldBatch([{"x": [1.0], "y": "s"}, {"x": [1.0, 2.0], "y": "s"}, {"x": [1e9, 1.0], "y": 1.0}])
    batch.vector("x", 2, max_abs=1e6)
    batch.scalar("y", max_abs=1e6)
    assert [(i, r) for i, r, _ in batch.rejected()] == [(0, "wrong_shape"), (1, "wrong_type"), (2, "out_of_range")]


def test_fast_path_values_and_rejected_rows_zeroed():
    objs = [{"x": [1, 2.5], "y": True}, {"x": [3.0, -4.0], "y": 0}, {"x": [5.0, float("inf")], "y": 1}]
    batch = FieldBatch(objs)
    x = batch.vector("x", 2)
    y = batch.scalar("y")
    np.testing.assert_array_equal(x, [[1.0, 2.5], [3.0, -4.0], [0.0, 0.0]])
    np.testing.assert_array_equal(y, [1.0, 0.0, 0.0])  # booleans are numbers; row 2 zeroed
    assert x.dtype == np.float64 and batch.accepted().tolist() == [0, 1]


def test_numeric_strings_are_not_numbers():
    batch = FieldBatch([{"x": ["1.5", "2"]}, {"x": [1.5, 2.0]}, {"x": 3.0}, {"x": None}])
    batch.vector("x", 2)
    assert [(i, r) for i, r, _ in batch.rejected()] == [(0, "wrong_type"), (2, "wrong_type"), (3, "wrong_type")]


json_value = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10**30, 10**30)
    | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["x", "y"]), inner, max_size=2),
    max_leaves=6,
)
good_record = st.builds(
    lambda x, y: {"x": x, "y": y},
    st.lists(st.floats(-10, 10), min_size=2, max_size=2),
    st.floats(-10, 10),
)


def classify(objs):
    batch = FieldBatch(objs)
    x = batch.vector("x", 2, max_abs=1e6)
    y = batch.scalar("y", max_abs=1e6)
    rejected = {i: r for i, r, _ in batch.rejected()}
    return [(rejected[i],) if i in rejected else (None, tuple(x[i]), y[i]) for i in range(len(objs))]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(good_record | json_value | st.builds(lambda x: {"x": x, "y": 1.0}, json_value)
                | st.builds(lambda y: {"x": [1.0, 2.0], "y": y}, json_value), max_size=8))
def test_verdict_per_record_does_not_depend_on_the_batch(objs):
    """The fast path (whole batch) and the per-record path agree record by record."""
    together = classify(objs)
    alone = [classify([o])[0] for o in objs]
    assert together == alone
    for verdict in together:
        if verdict[0] is None:
            _, x, y = verdict
            assert all(np.isfinite(x)) and np.isfinite(y) and max(map(abs, x)) <= 1e6
        else:
            assert verdict[0] in records.REASONS


def test_empty_batch():
    batch = FieldBatch([])
    assert batch.vector("x", 3).shape == (0, 3) and batch.scalar("y").shape == (0,)
    assert batch.accepted().size == 0 and batch.rejected() == []


def test_round_trip_through_json_text():
    objs = [{"x": [0.1, 0.2], "y": 3}]
    dec = decode_json([json.dumps(o).encode() for o in objs])
    batch = FieldBatch(dec.values)
    np.testing.assert_array_equal(batch.vector("x", 2), [[0.1, 0.2]])


def test_binary_labels_reject_other_numbers_after_earlier_field_checks():
    objs = [{"x": [1.0], "y": 1}, {"x": [1.0], "y": 0.5}, {"x": [1.0], "y": True},
            {"x": ["a"], "y": 2}, {"x": [1.0], "y": 2}, {"x": [1.0], "y": -1e9}]
    batch = FieldBatch(objs)
    batch.vector("x", 1)
    y = batch.binary("y", max_abs=1e6)
    assert batch.accepted().tolist() == [0, 2]
    assert y.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]  # rejected rows hold zeros
    rejected = {i: (reason, detail) for i, reason, detail in batch.rejected()}
    assert rejected[1] == ("out_of_range", "'y' must be 0 or 1, got 0.5")
    assert rejected[3][0] == "wrong_type"  # the first failed check wins
    assert rejected[4] == ("out_of_range", "'y' must be 0 or 1, got 2")
    assert rejected[5][0] == "out_of_range" and "beyond" in rejected[5][1]  # max_abs checked first
