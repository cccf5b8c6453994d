"""Record decoding and numeric field validation shared by model families."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_vips import records
from stream_vips.records import FieldBatch, RecordRejected, decode_json, decode_one
from stream_vips.records import decoding as records_decoding  # the decoder's internals


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
    objs = [{"x": [1, 2.5], "y": 1}, {"x": [3.0, -4.0], "y": 0}, {"x": [5.0, float("inf")], "y": 1}]
    batch = FieldBatch(objs)
    x = batch.vector("x", 2)
    y = batch.scalar("y")
    np.testing.assert_array_equal(x, [[1.0, 2.5], [3.0, -4.0], [0.0, 0.0]])
    np.testing.assert_array_equal(y, [1.0, 0.0, 0.0])  # integers become floats; row 2 zeroed
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
    objs = [{"x": [1.0], "y": 1}, {"x": [1.0], "y": 0.5}, {"x": [1.0], "y": 0.0},
            {"x": ["a"], "y": 2}, {"x": [1.0], "y": 2}, {"x": [1.0], "y": -1e9}]
    batch = FieldBatch(objs)
    batch.vector("x", 1)
    y = batch.binary("y", max_abs=1e6)
    assert batch.accepted().tolist() == [0, 2]
    assert y.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # rejected rows hold zeros
    rejected = {i: (reason, detail) for i, reason, detail in batch.rejected()}
    assert rejected[1] == ("out_of_range", "'y' must be 0 or 1, got 0.5")
    assert rejected[3][0] == "wrong_type"  # the first failed check wins
    assert rejected[4] == ("out_of_range", "'y' must be 0 or 1, got 2")
    assert rejected[5][0] == "out_of_range" and "beyond" in rejected[5][1]  # max_abs checked first


# -- JSON true/false are not numbers -------------------------------------------------------------

BOOLEAN_RECORDS = [b'{"x": [0.5, 0.5], "y": true}', b'{"x": [0.5, 0.5], "y": false}',
                   b'{"x": [true, 0.5], "y": 1}', b'{"x": [0.5, false], "y": 0}']


@pytest.mark.parametrize("batch_size", [1, 50])  # alone (the slow path) and among good records
def test_booleans_are_wrong_type_wherever_numbers_are_expected(batch_size):
    good = [b'{"x": [0.25, -0.5], "y": 1}'] * (batch_size - 1)
    for raw in BOOLEAN_RECORDS:
        batch = FieldBatch(decode_json(good + [raw]).values)
        batch.vector("x", 2, max_abs=1e6)
        y = batch.scalar("y", max_abs=1e6)
        assert batch.accepted().tolist() == list(range(batch_size - 1)), raw
        (index, reason, detail), = batch.rejected()
        assert (index, reason) == (batch_size - 1, "wrong_type") and "boolean" in detail, raw
        assert y[index] == 0.0  # a rejected row holds zeros, not 1.0 for true
    fields = FieldBatch([{"y": True}, {"y": False}, {"y": 1}, {"y": 0}])
    assert fields.binary("y").tolist() == [0.0, 0.0, 1.0, 0.0]
    assert [(i, r) for i, r, _ in fields.rejected()] == [(0, "wrong_type"), (1, "wrong_type")]


FAMILY_PARAMS = {
    "linreg": {"dim": 2}, "logistic": {"dim": 2}, "dpvi": {"dim": 2}, "ops": {"dim": 2, "epsilon": 1.0},
    "sgld": {"dim": 2, "step_size": 0.01},
    "sep_probit": {"dim": 2, "clip": 1.0}, "sep_mixture": {"n_components": 2, "dim": 2, "clip": 1.0},
    "lda": {"vocabulary": ["apple", "pear"], "doc_length": 4},
    "sbn": {"n_visible": 2, "n_latent": 2}, "sep_bnn": {"dim": 2, "clip": 1.0},
}


@pytest.mark.parametrize("family", sorted(FAMILY_PARAMS))
def test_every_family_rejects_booleans_for_numbers_and_keeps_0_1_labels(family):
    """`{"y": true}` for linreg, booleans in x, true/false labels and counts: wrong_type in every
    family that reads numbers; labels 0 and 1 (integers or floats) still pass."""
    from stream_vips.models import MODEL_FAMILIES, model_class

    assert set(FAMILY_PARAMS) == set(MODEL_FAMILIES)  # a new family joins this test
    model = model_class(family)(dataset_size=100, **FAMILY_PARAMS[family])
    if family == "lda":
        good = [b'{"counts": {"apple": 2, "pear": 1}}', b'{"tokens": ["apple", "pear"]}']
        bad = [b'{"counts": {"apple": true}}', b'{"counts": {"apple": 1, "pear": false}}']
    elif family == "sbn":  # a binary vector
        good = [b'{"y": [0, 1]}', b'{"y": [1, 1]}', b'{"y": [1.0, 0.0]}']
        bad = [b'{"y": [true, 0]}', b'{"y": [0, false]}']
    elif family == "sep_mixture":  # no label
        good, bad = [b'{"x": [0.5, -0.5]}', b'{"x": [0, 1]}'], [b'{"x": [true, 0.5]}', b'{"x": [0.5, false]}']
    else:
        good = [b'{"x": [0.5, -0.5], "y": 1}', b'{"x": [0.5, -0.5], "y": 0}', b'{"x": [0, 1], "y": 1.0}',
                b'{"x": [0.5, 0.5], "y": 0.0}']
        bad = BOOLEAN_RECORDS
    parsed = model.parse_batch(decode_json(good + bad).values)
    assert parsed.accepted.tolist() == list(range(len(good)))
    assert [(i, r) for i, r, _ in parsed.rejected] == [(len(good) + j, "wrong_type") for j in range(len(bad))]


# -- orjson and json decode the same documents to the same values ------------------------------

TRICKY = [
    b'{"x": [0.5, 1.0], "y": 2}', b'{"y": NaN}', b"NaN", b'{"y": Infinity}', b'{"y": -Infinity}',
    b'{"y": 1e400}', b'{"y": -1e400}', b'{"y": 1E-400}', b'{"y": -0.0}', b'{"y": -0}', b'{"y": 0.1}',
    b'{"y": 2.2250738585072014e-308}', b'{"y": 1.7976931348623157e308}', b'{"y": 5e-324}',
    b'{"y": 9223372036854775807}', b'{"y": -9223372036854775808}', b'{"y": -9223372036854775809}',
    b'{"y": 18446744073709551615}', b'{"y": 18446744073709551616}', b'{"y": 123456789012345678901234567890}',
    b'{"y": -123456789012345678901234567890}', b'{"y": 1234567890123456789}', b'{"y": 123456789012345678}',
    b'{"y": 0.1000000000000000055511151231257827}', b'{"y": 12345678901234567890.5}',
    b'{"a": 1, "a": 2}', b"", b"   ", b"\n", b"\t\r\n", b"{", b'{"a": 1}x', b'{"a": 1} ', b' {"a": 1}\n',
    b'{"a": 1}\x00', b'\x0c{"a": 1}', b'\xef\xbb\xbf{"a": 1}', "\ufeff{\"a\": 1}", '{"a": 1}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-16-le"), '{"a": 1}'.encode("utf-32"), b'{"s": "\\ud800"}', b'{"s": "\\ud83d\\ude00"}',
    b'{"s": "\xff"}', b'{"s": "\xed\xa0\x80"}', b'{"s": "\xc3\xa9"}', '{"s": "\ud800"}', '{"s": "é"}',
    b"[1, 2,]", b'{"a": 01}', b'{"a": .5}', b'{"a": 1.}', b'{"a": +1}', b'{"a": 1e}', b'"\t"', b'{"a": "\x00"}',
    b"true", b"false", b"null", b"[]", b"{}", b"1", b'"text"', b"[" * 200 + b"]" * 200, b"{'a': 1}",
    b'{"a": true, "b": [null, false, {"c": "d"}]}', b'{"\\u0061": "\\n\\u00e9"}', bytearray(b'{"a": 1}'),
    memoryview(b'{"a": 1}'), None, 17,
]


def _same(a, b) -> bool:
    """Equal values of exactly the same types (floats bit for bit, NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _json_only(raws, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(records_decoding, "_fast_loads", json.loads)
        return decode_json(raws)


def _assert_same_decoding(raws, monkeypatch):
    fast, reference = decode_json(raws), _json_only(raws, monkeypatch)
    assert fast.index == reference.index
    assert fast.rejected == reference.rejected  # same positions, reason codes and json's details
    assert all(_same(a, b) for a, b in zip(fast.values, reference.values))
    return fast


def test_orjson_is_the_fast_decoder():
    orjson = pytest.importorskip("orjson")
    assert records_decoding._fast_loads is orjson.loads


def test_fast_decoding_matches_json_on_tricky_documents(monkeypatch):
    decoded = _assert_same_decoding(TRICKY, monkeypatch)
    reasons = {i: r for i, r, _ in decoded.rejected}
    assert reasons[TRICKY.index(b"")] == records.EMPTY_DOCUMENT
    assert reasons[TRICKY.index(b"{")] == records.INVALID_JSON
    assert reasons[TRICKY.index(None)] == records.TOMBSTONE  # a record without a value (Kafka tombstone)
    # json's extensions reach validation, which rejects them with their own codes
    for doc, reason in ((b'{"y": NaN}', records.NON_FINITE), (b'{"y": 1e400}', records.NON_FINITE),
                        (b'{"y": 123456789012345678901234567890}', records.OUT_OF_RANGE)):
        obj = decoded.values[decoded.index.index(TRICKY.index(doc))]
        batch = FieldBatch([obj])
        batch.scalar("y", max_abs=1e6)
        assert [r for _, r, _ in batch.rejected()] == [reason]
    for i, doc in enumerate(TRICKY):  # decode_one agrees with decode_json
        if i in reasons:
            with pytest.raises(RecordRejected) as info:
                decode_one(doc)
            assert info.value.reason == reasons[i]
        else:
            assert _same(decode_one(doc), decoded.values[decoded.index.index(i)])


json_text = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
).map(lambda v: json.dumps(v).encode())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(json_text | st.binary(max_size=12)
                | st.builds(lambda t, cut: t[:cut], json_text, st.integers(0, 40)), max_size=10))
def test_fast_decoding_matches_json_on_generated_documents(raws):
    with pytest.MonkeyPatch.context() as monkeypatch:
        _assert_same_decoding(raws, monkeypatch)


def test_whole_batch_fast_path_gives_the_per_record_results(monkeypatch):
    """A batch of valid small documents takes the whole-batch path; one long integer, an oversized
    document or a non-bytes value anywhere sends the batch record by record, with json's results."""
    good = [json.dumps({"x": [0.1 * i, -2.5], "y": i}).encode() for i in range(50)]
    for extra in ([], [b'{"y": 123456789012345678901234567890}'], [b'{"y": 1e400}'], ['{"y": 1}'], [b"{"]):
        batch = good[:25] + extra + good[25:]
        _assert_same_decoding(batch, monkeypatch)
    big = decode_json(good + [b'{"y": -123456789012345678901234567890}']).values[-1]["y"]
    assert type(big) is int and big == -123456789012345678901234567890
    limited = decode_json(good, max_bytes=len(good[-1]) - 1)
    assert [i for i, r, _ in limited.rejected if r == records.TOO_LARGE] == [
        i for i, raw in enumerate(good) if len(raw) > len(good[-1]) - 1]


def test_a_deeply_nested_document_is_rejected_not_raised():
    """json recurses per nesting level: a hostile document must become a dead letter, not a crash."""
    from stream_vips.records import decode_json, decode_one

    deep = b"[" * 100_000 + b"]" * 100_000
    decoded = decode_json([deep, b'{"x": [1.0]}', b'{"a":' * 50_000])
    assert decoded.index == [1]
    assert [(i, reason) for i, reason, _ in decoded.rejected] == [(0, "invalid_json"), (2, "invalid_json")]
    assert decoded.rejected[0][2] == "document nested too deeply"
    with pytest.raises(RecordRejected, match="nested too deeply"):
        decode_one(deep)


# -- a few bad records cost only themselves: the batch path equals the per-record reference -----

#: Documents orjson refuses or must not read, or that validation rejects, mixed into clean batches.
BAD_POOL = [doc for doc in TRICKY if doc not in (b'{"x": [0.5, 1.0], "y": 2}',)] + [
    b'{"x": [[1, 2], {"a": [3]}], "y": {"z": [null]}}',  # nested
    b'{"x": [' + b"9" * 30 + b', 1], "y": 1}', b'{"x": [1, 2], "y": -9999999999999999999}',
    b'{"x": [1, 2], "y": 99999999999999999999}', b'{"x": [' + b"7" * 400 + b', 0], "y": 1}',
    b'{"x": [1e00000000000000000001, 2], "y": 1}', b'{"x": [1, 2], "y": 1e-00000000000000000000001}',
    b'{"x": [0.' + b"1234567890" * 4 + b', 2], "y": 1}',  # a 40-digit fraction
    b'{"x": [1, 2], "y": 12345678901234567890.25}',
    b'{"s": "\xff\xfe", "x": [1, 2], "y": 1}', b"\x80", b'{"x": [1, 2], "y": "\xc3"}',  # not UTF-8
    b'{"x": [1, 2], "x": [3, 4], "y": 1}', b'{"y": 1, "y": NaN, "x": [1, 2]}',  # duplicate keys
    b'{"x": [NaN, 1], "y": 1}', b'{"x": [1, 2], "y": -Infinity}', b'{"x": [Infinity, 1], "y": 1}',
    b"[" * 3000 + b"]" * 3000, b'{"a":' * 250 + b"1" + b"}" * 250, b"[" * 100_000,  # deep nesting
    b'{"x": ["1.5", 2], "y": 1}', b'{"x": [1, null], "y": 1}', b'{"x": [1, 2, 3], "y": 1}', b'{"x": 1, "y": 1}',
    b'{"y": 1}', b'{"x": [1, 2]}', b'{"x": [true, false], "y": false}', b'{"x": [1e7, 2], "y": 1}',
    b'{"x": [1, 2], "y": 1} {"x": [1, 2], "y": 1}', b'1, 2', b'{"x": [1, 2], "y": 1}]',
]


def _clean_line(rng: np.random.Generator) -> bytes:
    """A valid record whose floats often have 19+ digit fractions (small magnitudes)."""
    x = rng.standard_normal(2) * 10.0 ** rng.integers(-7, 3, size=2)
    doc = {"x": x.tolist(), "y": float(rng.standard_normal() * 10.0 ** rng.integers(-7, 3))}
    if rng.random() < 0.1:
        doc["note"] = f"v{rng.integers(10**9)}.{rng.integers(10**18)}{rng.integers(10**9)}"  # digits in a string
    if rng.random() < 0.1:
        doc["id"] = int(rng.integers(-10**17, 10**17))
    return json.dumps(doc).encode()


def _mixed_batch(seed: int, n: int, bad_fraction: float) -> list:
    rng = np.random.default_rng(seed)
    batch = [_clean_line(rng) for _ in range(n)]
    bad = np.flatnonzero(rng.random(n) < bad_fraction)
    order = rng.permutation(len(BAD_POOL))  # cycles through the pool: every kind once enough are bad
    for j, i in enumerate(bad.tolist()):
        batch[i] = BAD_POOL[order[j % len(BAD_POOL)]]
    return batch


_KIND = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def _reference_fields(obj, dim: int = 2, max_abs: float = 1e6):
    """The documented checks written out for one record (an independent spec of FieldBatch's
    vector("x", dim) then scalar("y")): ('ok', x, y) or (reason, detail) of the first failure."""
    if type(obj) is not dict:
        return records.NOT_OBJECT, f"record is a JSON {_KIND.get(type(obj), 'number')}, expected an object"
    out = {}
    for name in ("x", "y"):
        if name not in obj:
            return records.MISSING_FIELD, f"record has no {name!r} field"
        v = obj[name]
        if name == "x":
            if type(v) is not list:
                return records.WRONG_TYPE, f"'x' must be an array of {dim} numbers, got {_KIND.get(type(v), 'number')}"
            if len(v) != dim:
                return records.WRONG_SHAPE, f"'x' has {len(v)} entries, expected {dim}"
            other = [e for e in v if type(e) not in (int, float)]  # true/false are not numbers
            if other:
                return records.WRONG_TYPE, f"'x' must contain only numbers, found {_KIND[type(other[0])]}"
            elements = v
        else:
            if type(v) not in (int, float):
                return records.WRONG_TYPE, f"'y' must be a number, got {_KIND.get(type(v), 'number')}"
            elements = [v]
        try:
            floats = [float(e) for e in elements]
        except OverflowError:
            return records.OUT_OF_RANGE, f"{name!r} has an integer too large for a float"
        if not all(np.isfinite(floats)):
            return records.NON_FINITE, f"{name!r} contains NaN or infinity"
        if max(map(abs, floats)) > max_abs:
            return records.OUT_OF_RANGE, f"{name!r} has a value beyond +-{max_abs:g}"
        out[name] = floats
    return "ok", out["x"], out["y"][0]


def _reference_record(raw, monkeypatch):
    """One record alone through the per-record reference: json's decode_one, then the spec."""
    with monkeypatch.context() as m:
        m.setattr(records_decoding, "_fast_loads", json.loads)
        try:
            obj = decode_one(raw)
        except RecordRejected as exc:
            return exc.reason, exc.detail
    return _reference_fields(obj)


@pytest.mark.parametrize("seed, n, bad_fraction", [(0, 2000, 0.01), (1, 2000, 0.01), (2, 5000, 0.01),
                                                   (3, 800, 0.2), (4, 300, 0.0), (5, 200, 1.0)])
def test_batch_with_bad_records_decodes_and_validates_as_each_record_alone(seed, n, bad_fraction, monkeypatch):
    """Same accepted rows (same floats) and the same (index, reason, detail) rejections as the
    per-record reference: json decoding and validation of every record on its own."""
    raws = _mixed_batch(seed, n, bad_fraction)
    decoded = _assert_same_decoding(raws, monkeypatch)  # against json over the batch
    batch = FieldBatch(decoded.values)
    x, y = batch.vector("x", 2, max_abs=1e6), batch.scalar("y", max_abs=1e6)
    position = np.asarray(decoded.index, dtype=np.intp)
    got = {int(position[i]): ("ok", x[i].tolist(), y[i]) for i in batch.accepted().tolist()}
    got.update({i: (reason, detail) for i, reason, detail in decoded.rejected})
    got.update({int(position[i]): (reason, detail) for i, reason, detail in batch.rejected()})
    expected = {i: _reference_record(raw, monkeypatch) for i, raw in enumerate(raws)}
    assert sorted(got) == list(range(n))
    for i in range(n):
        a, b = got[i], expected[i]
        assert a[0] == b[0] and a[1:] == b[1:] or (a[0] == "ok" and _same(a, b)), (i, raws[i], a, b)
    reasons = {v[0] for v in got.values()}
    if 0 < bad_fraction < 1:
        assert "ok" in reasons and len(reasons) >= 3
    if n * bad_fraction >= len(BAD_POOL):  # the pool's kinds all show up
        assert {"ok", records.INVALID_JSON, records.EMPTY_DOCUMENT, records.NOT_OBJECT, records.MISSING_FIELD,
                records.WRONG_TYPE, records.WRONG_SHAPE, records.NON_FINITE, records.OUT_OF_RANGE} <= reasons


def test_only_the_bad_documents_take_the_per_document_path(monkeypatch):
    """A clean batch (floats with 19+ digit fractions included) is decoded by orjson alone; with
    bad documents, exactly those reach the per-document json path (the rest stays one C pass)."""
    pytest.importorskip("orjson")
    seen = []
    reference = records_decoding._decode_reference

    def spy(raws, positions, max_bytes):
        seen.append(list(positions))
        return reference(raws, positions, max_bytes)

    monkeypatch.setattr(records_decoding, "_decode_reference", spy)
    rng = np.random.default_rng(7)
    clean = [_clean_line(rng) for _ in range(3000)]
    assert sum(b"0" * 19 in raw.translate(records_decoding._DIGITS_AS_ZERO) for raw in clean) > 100  # long fractions
    decode_json(clean)
    assert seen == []
    batch = list(clean)
    bad = {17: b'{"x": [NaN, 1], "y": 1}', 1000: b"{", 1001: b'{"y": 123456789012345678901}',
           2999: '{"x": [1, 2], "y": 1}', 500: b'{"x": [1, 2], "y": 1}' + b" " * 200}
    for i, doc in bad.items():
        batch[i] = doc
    decoded = decode_json(batch, max_bytes=200)
    assert seen == [sorted(bad)]
    assert [i for i, _, _ in decoded.rejected] == [500, 1000]
    assert decoded.index == [i for i in range(3000) if i not in (500, 1000)]


@pytest.mark.parametrize("doc, orjson_reads_it", [
    (b'{"y": 0.0001234567890123456789}', True), (b'{"y": -0.000000000000000000000001}', True),
    (b'{"s": "a.12345678901234567890"}', True), (b'{"y": 123.4567890123456789012e3}', True),
    (b'{"y": 12345678901234567890}', False), (b'{"y": -1234567890123456789}', False),
    (b'{"y": 1e-0000000000000000000001}', False), (b'{"y": 0.' + b"1" * 38 + b"}", False),
    (b'{"s": "12345678901234567890"}', False), (b"1234567890123456789", False), ("{}", False),
])
def test_which_documents_orjson_may_read(doc, orjson_reads_it):
    """orjson reads integers beyond 64 bits as floats: a 19+ digit run that is not a fraction (or a
    fraction of 38+ digits, conservatively) goes to json, in a batch as alone."""
    batch = [b'{"x": [0.5]}', doc, b'{"x": [0.25]}']
    assert records_decoding._orjson_candidates(batch, None).tolist() == [True, orjson_reads_it, True]
    assert records_decoding._orjson_candidates([doc], None).tolist() == [orjson_reads_it]


long_fraction = st.builds(
    lambda sign, whole, frac, exp: f"{sign}{whole}.{frac}{exp}".encode(),
    st.sampled_from(["", "-"]), st.integers(0, 10**17), st.text("0123456789", min_size=15, max_size=45),
    st.sampled_from(["", "e-5", "E+12", "e-300", "e307", "e-320", "e308"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(long_fraction, min_size=1, max_size=6))
def test_long_fractions_decode_exactly_as_json(numbers):
    """Long fractions are left to orjson: its values must be json's, bit for bit."""
    raws = [b'{"y": ' + num + b"}" for num in numbers] + [b"[" + b", ".join(numbers) + b"]"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        _assert_same_decoding(raws, monkeypatch)
