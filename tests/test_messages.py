"""Model messages: schema, bit-exact arrays, round trips."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime

import numpy as np
import pytest

from stream_vips.messages import (
    MessageError,
    build_message,
    decode_array,
    decode_state,
    dumps,
    encode_array,
    loads,
    privacy_report,
    schema,
    validate_message,
)


def report(**kw):
    base = dict(epsilon_spent=0.25, delta=1e-5, epsilon_budget=1.0, accountant="pld",
                sampling="poisson", q=0.1, noise_multiplier=3.0, steps=4, halted=False, seeded=True)
    base.update(kw)
    return privacy_report(**base)


def message():
    rng = np.random.default_rng(0)
    state = {"precision": rng.normal(size=(4, 4)), "shift": rng.normal(size=4), "shape": np.array(3.5)}
    when = datetime(2026, 11, 26, 0, 0, tzinfo=UTC)
    return build_message("model-a", "linreg", {"dim": 4, "y_bound": 1.0}, 3, state, report(), when), state


def test_arrays_round_trip_bit_exact():
    rng = np.random.default_rng(1)
    values = [rng.normal(size=(3, 5)), np.array([np.finfo(float).tiny, -0.0, 1e308, 5e-324]),
              np.array(2.5), np.zeros((0, 3)), rng.normal(size=(4, 4)).T]  # non-contiguous input
    for a in values:
        enc = encode_array(a)
        json.dumps(enc)
        b = decode_array(json.loads(json.dumps(enc)))
        assert b.shape == a.shape and b.dtype == np.float64
        assert a.astype("<f8").tobytes() == np.ascontiguousarray(b).astype("<f8").tobytes()
    big_endian = np.arange(6, dtype=">f8").reshape(2, 3)
    np.testing.assert_array_equal(decode_array(encode_array(big_endian)), big_endian)
    ints = decode_array(encode_array(np.arange(5), dtype="int64"))
    assert ints.dtype == np.int64 and ints.tolist() == [0, 1, 2, 3, 4]


def test_encoding_is_documented_little_endian_base64():
    enc = encode_array(np.array([1.0]))
    assert enc == {"dtype": "float64", "shape": [1], "encoding": "base64-le", "data": "AAAAAAAA8D8="}


def test_decode_array_rejects_bad_payloads():
    enc = encode_array(np.arange(4.0))
    with pytest.raises(MessageError, match="bytes"):
        decode_array({**enc, "shape": [5]})
    with pytest.raises(MessageError, match="base64"):
        decode_array({**enc, "data": "not base64!"})
    with pytest.raises(MessageError, match="encoding"):
        decode_array({**enc, "encoding": "hex"})


def test_message_round_trip_and_state_decode():
    msg, state = message()
    back = loads(dumps(msg))
    assert back == msg
    got = decode_state(back)
    assert set(got) == set(state)
    for k in state:
        assert got[k].tobytes() == np.asarray(state[k], dtype=float).tobytes()
    assert back["privacy"]["paper_sigma"] == 1.5  # z / 2 (privacy rule 2 in docs/privacy.md)
    assert back["privacy"]["seeded"] is True  # privacy rule 9 in docs/privacy.md
    assert back["created_at"] == "2026-11-26T00:00:00Z"


def test_schema_rejects_missing_privacy_report_and_bad_fields():
    msg, _ = message()
    for field in ("privacy", "natural_parameters", "version"):
        broken = copy.deepcopy(msg)
        del broken[field]
        with pytest.raises(MessageError, match=field):
            validate_message(broken)
    for field in ("seeded", "paper_sigma", "epsilon_spent", "halted"):
        broken = copy.deepcopy(msg)
        del broken["privacy"][field]
        with pytest.raises(MessageError, match=field):
            validate_message(broken)
    broken = copy.deepcopy(msg)
    broken["privacy"]["sampling"] = "shuffle"
    with pytest.raises(MessageError, match="privacy/sampling"):
        validate_message(broken)
    broken = copy.deepcopy(msg)
    broken["raw_records"] = [[1, 2]]  # nothing outside the documented fields
    with pytest.raises(MessageError, match="raw_records"):
        validate_message(broken)
    with pytest.raises(MessageError):
        build_message("m", "linreg", {}, 0, {"a": np.zeros(1)}, {"epsilon_spent": 0.1})


def test_dumps_is_strict_json_and_schema_is_valid_2020_12():
    msg, _ = message()
    msg["hyperparameters"]["bad"] = float("nan")
    with pytest.raises(ValueError):
        dumps(msg)
    assert schema()["$schema"].endswith("2020-12/schema")
    assert all("description" in p for p in schema()["$defs"]["privacy"]["properties"].values())


def non_private_report(**kw):
    base = dict(epsilon_spent=float("inf"), delta=1e-5, epsilon_budget=float("inf"), accountant="none",
                sampling="poisson", q=1.0, noise_multiplier=0.0, steps=4, halted=False, seeded=True,
                private=False)
    base.update(kw)
    return privacy_report(**base)


def test_non_private_message_carries_null_epsilon_and_a_flag_through_strict_json():
    from stream_vips.messages import is_private

    rep = non_private_report()
    assert rep["epsilon_spent"] is None and rep["epsilon_budget"] is None and rep["private"] is False
    assert rep["accountant"] == "none" and "ledger_id" not in non_private_report(ledger_id="abc")
    msg = build_message("m", "linreg", {"dim": 1}, 3, {"shift": np.zeros(1)}, rep)
    back = loads(dumps(msg))  # strict JSON: infinity would raise here
    assert back["privacy"]["epsilon_spent"] is None and not is_private(back)
    with pytest.raises(ValueError, match="noise multiplier 0"):
        non_private_report(noise_multiplier=1.0)


def test_private_messages_are_unchanged_except_the_private_flag():
    from stream_vips.messages import is_private

    msg, _ = message()
    assert msg["privacy"]["private"] is True and is_private(msg)
    legacy = copy.deepcopy(msg)
    del legacy["privacy"]["private"]  # messages written before the flag existed stay valid and private
    assert is_private(validate_message(legacy))


def test_schema_ties_null_epsilon_to_the_non_private_flag():
    msg, _ = message()
    for field in ("epsilon_spent", "epsilon_budget"):
        broken = copy.deepcopy(msg)
        broken["privacy"][field] = None  # a private message must say what it spent
        with pytest.raises(MessageError, match=field):
            validate_message(broken)
    np_msg = build_message("m", "linreg", {"dim": 1}, 0, {"shift": np.zeros(1)}, non_private_report())
    for field, value in (("epsilon_spent", 0.5), ("epsilon_budget", 1.0), ("noise_multiplier", 2.0),
                         ("accountant", "pld")):
        broken = copy.deepcopy(np_msg)
        broken["privacy"][field] = value  # a non-private message never carries a guarantee's numbers
        with pytest.raises(MessageError):
            validate_message(broken)
    broken = copy.deepcopy(np_msg)
    broken["privacy"]["ledger_id"] = "x"
    with pytest.raises(MessageError):
        validate_message(broken)


def test_huge_shape_is_refused_by_its_byte_count_not_a_wrapped_product():
    enc = {**encode_array(np.zeros(0)), "shape": [2**32, 2**32]}  # np.prod wraps 2**64 to 0 bytes
    with pytest.raises(MessageError, match="0 bytes, shape \\[4294967296, 4294967296\\]"):
        decode_array(enc)


def test_non_finite_natural_parameters_are_no_state():
    msg, _ = message()
    msg["natural_parameters"]["shift"] = encode_array(np.array([np.nan, 1.0, 2.0, 3.0]))
    with pytest.raises(MessageError, match="shift.*NaN or infinity"):
        decode_state(msg)


@pytest.mark.parametrize("change, reason", [
    (dict(noise_multiplier=0.0, paper_sigma=0.0, accountant="none"), "privacy/accountant"),  # the schema's if/then
    (dict(noise_multiplier=0.0, paper_sigma=0.0), "privacy/noise_multiplier"),
    (dict(accountant="none"), "privacy/accountant"),
    (dict(epsilon_spent=50.0), "epsilon_spent 50 exceeds epsilon_budget 1"),
    (dict(epsilon_spent=float("inf")), "epsilon_spent inf is not a finite"),  # non-strict JSON carries Infinity
    (dict(epsilon_spent=float("nan")), "epsilon_spent nan is not a finite"),
])
def test_a_privacy_claim_without_noise_accountant_or_budget_is_refused(change, reason):
    from stream_vips.messages import is_private

    msg, _ = message()
    bad = copy.deepcopy(msg)
    bad["privacy"].update(change)
    with pytest.raises(MessageError, match=reason):
        validate_message(bad)
    assert not is_private(bad)


@pytest.mark.parametrize("change, reason", [
    (dict(noise_multiplier=0.0, paper_sigma=0.0), "noise_multiplier 0.0 adds no noise"),
    (dict(accountant="none"), "accountant 'none' accounts nothing"),
    (dict(epsilon_spent=50.0), "epsilon_spent 50 exceeds epsilon_budget 1"),
])
def test_a_legacy_message_with_finite_epsilon_claims_privacy_and_must_back_it(change, reason):
    from stream_vips.messages import is_private

    msg, _ = message()
    bad = copy.deepcopy(msg)
    del bad["privacy"]["private"]
    bad["privacy"].update(change)
    with pytest.raises(MessageError, match=f"claims privacy it does not have: {reason}"):
        validate_message(bad)
    assert not is_private(bad)


def test_spent_budget_within_round_off_is_private_and_a_halted_message_may_spend_it_all():
    from stream_vips.messages import SPEND_RTOL, is_private

    msg, _ = message()
    for eps in (1.0, 1.0 * (1 + SPEND_RTOL / 2), 1.0 / (1 + 1e-3) ** 2):
        ok = copy.deepcopy(msg)
        ok["privacy"].update(epsilon_spent=eps, halted=True)
        assert is_private(validate_message(ok))
