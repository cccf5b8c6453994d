"""Privacy events: validation, stable versioned JSON, refusal of unknown types."""

from __future__ import annotations

import json
import math

import pytest

from stream_vips.privacy.accountants import PldAccountant, RdpAccountant, StrongCompositionAccountant, UnsupportedEvent
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import (
    PureDpEvent,
    SubsampledGaussianEvent,
    UncertifiedEvent,
    UnknownEvent,
    event_from_dict,
)
from stream_vips.privacy.ledger import MemoryLedger


def test_round_trip_through_json_is_exact():
    e = SubsampledGaussianEvent(1.3, 0.05, "fixed", "replace_one", math.sqrt(2), count=7)
    back = event_from_dict(json.loads(json.dumps(e.to_dict())))
    assert back == e and hash(back) == hash(e)


def test_serialized_form_is_pinned():
    # Ledgers outlive code: the field names, type tag and version are part of the format.
    e = SubsampledGaussianEvent(2.0, 0.1, "poisson")
    assert e.to_dict() == {
        "type": "subsampled_gaussian", "version": 1, "noise_multiplier": 2.0, "sampling_rate": 0.1,
        "sampling": "poisson", "adjacency": "replace_one", "diameter": 2.0, "count": 1,
    }


def test_numeric_types_are_canonical():
    assert SubsampledGaussianEvent(2, 1, "fixed") == SubsampledGaussianEvent(2.0, 1.0, "fixed")


def test_paper_sigma_is_z_over_diameter():
    assert SubsampledGaussianEvent(3.0, 0.1, "fixed").paper_sigma == 1.5
    assert SubsampledGaussianEvent(3.0, 0.1, "poisson", "add_remove", 1.0).paper_sigma == 3.0


def test_unit_and_with_count():
    e = SubsampledGaussianEvent(1.0, 0.1, "poisson", count=5)
    assert e.unit() == SubsampledGaussianEvent(1.0, 0.1, "poisson") and e.unit().with_count(5) == e


@pytest.mark.parametrize("kwargs, word", [
    (dict(noise_multiplier=0.0), "noise_multiplier"),
    (dict(noise_multiplier=float("inf")), "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier"),
    (dict(sampling_rate=0.0), "sampling_rate"),
    (dict(sampling_rate=1.5), "sampling_rate"),
    (dict(sampling="shuffle"), "sampling"),
    (dict(adjacency="bounded"), "adjacency"),
    (dict(diameter=2.5), "diameter"),
    (dict(diameter=0.0), "diameter"),
    (dict(adjacency="add_remove"), "diameter"),  # add/remove needs diameter 1
    (dict(count=0), "count"),
    (dict(count=1.5), "count"),
])
def test_invalid_events_are_refused_naming_the_field(kwargs, word):
    args = dict(noise_multiplier=1.0, sampling_rate=0.1, sampling="poisson") | kwargs
    with pytest.raises(ValueError, match=word):
        SubsampledGaussianEvent(**args)


def test_unknown_type_version_and_fields_are_refused():
    good = SubsampledGaussianEvent(1.0, 0.1, "poisson").to_dict()
    with pytest.raises(UnknownEvent, match="unknown event type 'laplace'"):
        event_from_dict(good | {"type": "laplace"})
    with pytest.raises(UnknownEvent, match="version 2"):
        event_from_dict(good | {"version": 2})
    with pytest.raises(UnknownEvent, match="unknown fields"):
        event_from_dict(good | {"truncation": 3})
    missing = dict(good)
    del missing["sampling"]
    with pytest.raises(UnknownEvent):
        event_from_dict(missing)
    with pytest.raises(UnknownEvent):
        event_from_dict([1, 2])


def test_ledgers_written_before_uncertified_events_existed_read_unchanged():
    # the exact dicts an older ledger holds: no new field, same type tags and versions
    old = [{"type": "pure_dp", "version": 1, "epsilon": 0.5, "adjacency": "replace_one", "count": 2},
           {"type": "subsampled_gaussian", "version": 1, "noise_multiplier": 2.0, "sampling_rate": 0.1,
            "sampling": "poisson", "adjacency": "replace_one", "diameter": 2.0, "count": 1}]
    events = [event_from_dict(d) for d in old]
    assert events == [PureDpEvent(0.5, count=2), SubsampledGaussianEvent(2.0, 0.1, "poisson")]
    assert [e.to_dict() for e in events] == old and all(e.certified for e in events)


def test_uncertified_event_round_trips_and_its_form_is_pinned():
    e = UncertifiedEvent("ops", 1, "needs an exact sample", count=3)
    assert e.to_dict() == {"type": "uncertified", "version": 1, "mechanism": "ops", "nominal_epsilon": 1.0,
                           "reason": "needs an exact sample", "adjacency": "replace_one", "count": 3}
    back = event_from_dict(json.loads(json.dumps(e.to_dict())))
    assert back == e and hash(back) == hash(e) and not back.certified
    assert e.unit() == UncertifiedEvent("ops", 1.0, "needs an exact sample") and e.unit().with_count(3) == e


@pytest.mark.parametrize("kwargs, word", [
    (dict(mechanism=""), "mechanism"),
    (dict(reason=""), "reason"),
    (dict(nominal_epsilon=0.0), "nominal_epsilon"),
    (dict(nominal_epsilon=float("inf")), "nominal_epsilon"),
    (dict(adjacency="bounded"), "adjacency"),
    (dict(count=0), "count"),
])
def test_invalid_uncertified_events_are_refused_naming_the_field(kwargs, word):
    with pytest.raises(ValueError, match=word):
        UncertifiedEvent(**(dict(mechanism="ops", nominal_epsilon=1.0, reason="r") | kwargs))


@pytest.mark.parametrize("accountant", [PldAccountant(), RdpAccountant(), StrongCompositionAccountant(RdpAccountant())],
                         ids=["pld", "rdp", "strong"])
def test_every_accountant_and_the_monitor_refuse_an_uncertified_event(accountant):
    e = UncertifiedEvent("ops", 0.1, "needs an exact sample")
    assert not accountant.supports(e)
    with pytest.raises(UnsupportedEvent, match="needs an exact sample"):
        accountant.epsilon([e], 1e-5)
    monitor = BudgetMonitor(100.0, 1e-5, accountant, MemoryLedger())
    with pytest.raises(UnsupportedEvent):
        monitor.admit(e)
    assert monitor.ledger.events() == [] and not monitor.halted


def test_numeric_fields_are_canonical_floats_and_unit_is_one_step():
    """An integer z, q, diameter or epsilon is stored as a float (so equal events serialise alike),
    unit() is the event with count 1 and with_count() changes only the count."""
    g = SubsampledGaussianEvent(2, 1, "fixed", diameter=1, count=3)
    p, u = PureDpEvent(1, count=2), UncertifiedEvent("ops", 1, "inexact sampler", count=2)
    for value in (g.noise_multiplier, g.sampling_rate, g.diameter, p.epsilon, u.nominal_epsilon):
        assert type(value) is float and value in (1.0, 2.0)
    for event in (g, p, u):
        assert event.unit().count == 1 and event.unit() == event.with_count(1)
        assert event.with_count(2).unit().count == 1 and event.with_count(5).count == 5
        assert event.with_count(5).unit() == event.unit()


@pytest.mark.parametrize("make", [lambda v: SubsampledGaussianEvent(v, 0.5, "fixed"),
                                  lambda v: SubsampledGaussianEvent(1.0, v, "fixed"),
                                  lambda v: SubsampledGaussianEvent(1.0, 0.5, "fixed", diameter=v),
                                  lambda v: SubsampledGaussianEvent(1.0, 0.5, "fixed", count=v),
                                  lambda v: PureDpEvent(v), lambda v: PureDpEvent(1.0, count=v),
                                  lambda v: UncertifiedEvent("ops", v, "inexact"),
                                  lambda v: UncertifiedEvent("ops", 1.0, "inexact", count=v)])
@pytest.mark.parametrize("bad", [True, "1", math.inf, 0, -1])
def test_event_fields_refuse_booleans_text_infinities_and_values_below_their_range(make, bad):
    assert make(1) is not None  # 1 is valid for every one of these fields
    with pytest.raises(ValueError):
        make(bad)


def test_a_count_must_be_an_integer():
    for make in (lambda: SubsampledGaussianEvent(1.0, 0.5, "fixed", count=2.5), lambda: PureDpEvent(1.0, count=2.5),
                 lambda: UncertifiedEvent("ops", 1.0, "inexact", count=2.5)):
        with pytest.raises(ValueError, match="count"):
            make()


def test_a_replace_one_diameter_anywhere_in_its_range_is_accepted():
    for d in (0.25, 1.0, 1.5, 2.0):
        assert SubsampledGaussianEvent(1.0, 0.5, "fixed", diameter=d).diameter == d
