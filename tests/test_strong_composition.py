"""Strong composition (Dwork & Roth Thm 3.20) accountant and the pure-DP event."""

from __future__ import annotations

import math

import pytest

from stream_vips.privacy.accountants import (
    PldAccountant,
    RdpAccountant,
    StrongCompositionAccountant,
    UnsupportedEvent,
    heterogeneous_strong_epsilon,
    make_accountant,
    strong_composition_epsilon,
)
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import PureDpEvent, SubsampledGaussianEvent, UnknownEvent, event_from_dict
from stream_vips.privacy.ledger import MemoryLedger


def test_formula_hand_computed_cases():
    # eps0 = 0.1, k = 100, delta' = 1e-5: ln(1e5) = 11.512925; sqrt(200 * 11.512925) = 47.98526
    # -> 4.798526; 100 * 0.1 * (e^0.1 - 1) = 10 * 0.1051709 = 1.051709; total 5.850235
    assert strong_composition_epsilon(0.1, 100, 1e-5) == pytest.approx(5.850235, abs=2e-6)
    # eps0 = 0.5, k = 10, delta' = 1e-6: ln(1e6) = 13.815511; sqrt(20 * 13.815511) = 16.622581
    # -> 8.311291; 10 * 0.5 * (e^0.5 - 1) = 5 * 0.6487213 = 3.243606; total 11.554897
    assert strong_composition_epsilon(0.5, 10, 1e-6) == pytest.approx(11.554897, abs=2e-6)
    # k = 1: sqrt(2 ln 100) * 1 + (e - 1) = 3.034854 + 1.718282 = 4.753136
    assert strong_composition_epsilon(1.0, 1, 0.01) == pytest.approx(4.753136, abs=2e-6)
    assert strong_composition_epsilon(0.3, 0, 0.1) == 0.0


def test_heterogeneous_reduces_to_theorem_and_rejects_bad_input():
    assert heterogeneous_strong_epsilon({0.1: 100}, 1e-5) == pytest.approx(strong_composition_epsilon(0.1, 100, 1e-5))
    # two kinds: sqrt(2 ln(1/delta') (10 * 0.04 + 5 * 0.01)) + 10 * 0.2 (e^0.2-1) + 5 * 0.1 (e^0.1-1)
    want = math.sqrt(2 * math.log(1e4) * 0.45) + 2 * 0.2214028 + 0.5 * 0.1051709
    assert heterogeneous_strong_epsilon({0.2: 10, 0.1: 5}, 1e-4) == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="delta_slack"):
        strong_composition_epsilon(0.1, 3, 0.0)
    with pytest.raises(ValueError, match="k must"):
        strong_composition_epsilon(0.1, -1, 0.1)


def test_accountant_on_pure_events_is_the_formula_at_the_largest_slack():
    # pure events need no per-step delta, so the largest slack fraction (0.9) is best:
    # delta' = 9e-6; ln(1/9e-6) = 11.618286; sqrt(2000 * 11.618286) = 152.43547 -> 1.524355;
    # 1000 * 0.01 * (e^0.01 - 1) = 0.1005017; total 1.624856 (basic composition would give 10)
    acct = make_accountant("strong", "poisson")
    assert isinstance(acct, StrongCompositionAccountant)
    assert acct.epsilon([PureDpEvent(0.01, count=1000)], 1e-5) == pytest.approx(1.624856, abs=2e-6)
    # few releases: basic composition (k eps) is smaller and is taken
    assert acct.epsilon([PureDpEvent(0.5), PureDpEvent(0.25)], 1e-5) == pytest.approx(0.75)


def test_gaussian_steps_compose_their_one_step_epsilon():
    acct = make_accountant("strong", "poisson")
    event = SubsampledGaussianEvent(2.0, 0.05, "poisson")
    k, delta = 200, 1e-5
    got = acct.epsilon([event.with_count(k)], delta)
    pld = PldAccountant()
    candidates = []
    for f in (0.1, 0.25, 0.5, 0.75, 0.9):
        eps0 = pld.epsilon([event], (1 - f) * delta / k)
        candidates += [k * eps0, strong_composition_epsilon(eps0, k, f * delta)]
    assert got == pytest.approx(min(candidates), rel=1e-12)
    # the moments/PLD accountant is tighter than strong composition (the paper's Figure 2 premise)
    assert pld.epsilon([event.with_count(k)], delta) < got


def test_strong_accountant_refuses_what_its_per_step_accountant_refuses():
    acct = make_accountant("strong", "fixed")
    assert isinstance(acct.per_step, RdpAccountant)
    with pytest.raises(UnsupportedEvent):
        acct.check(SubsampledGaussianEvent(1.0, 0.1, "poisson"))
    with pytest.raises(ValueError, match="strong"):
        make_accountant("weak", "poisson")


def test_budget_monitor_with_strong_accountant_halts_exactly_at_budget():
    acct = make_accountant("strong", "fixed")
    monitor = BudgetMonitor(3.0, 1e-5, acct, MemoryLedger())
    event = SubsampledGaussianEvent(4.0, 0.1, "fixed")
    steps = 0
    while monitor.admit(event) is not None:
        steps += 1
    assert steps >= 1 and monitor.halted
    assert acct.epsilon([event.with_count(steps)], 1e-5) <= 3.0 < acct.epsilon([event.with_count(steps + 1)], 1e-5)


def test_pure_dp_event_round_trip_and_accountants():
    e = PureDpEvent(0.5, count=3)
    assert event_from_dict(e.to_dict()) == e and e.unit() == PureDpEvent(0.5)
    with pytest.raises(ValueError, match="epsilon"):
        PureDpEvent(0.0)
    with pytest.raises(UnknownEvent):
        event_from_dict({"type": "pure_dp", "version": 2, "epsilon": 1.0})
    # k-fold pure eps-DP is (k eps, 0)-DP: the PLD of the dominating pair never reports more
    # (up to its pessimistic grid: each of the 3 releases' losses is rounded up by less than one
    # interval h, which follows epsilon); the RDP route converts through Renyi divergences and may
    # not reach k eps, but it is finite and positive
    pld = PldAccountant()
    h = pld.interval(pld.group([e]))
    assert 1.5 <= pld.epsilon([e], 1e-5) <= 1.5 + 3 * h
    assert 0 < RdpAccountant().epsilon([e], 1e-5) < 2.0
    # one pure eps-DP release: the PLD of randomized response gives back eps (up to the grid)
    assert PldAccountant().epsilon([PureDpEvent(0.8)], 1e-9) == pytest.approx(0.8, abs=2e-3)
    # RDP of pure DP: min(eps, alpha eps^2 / 2)
    curve = RdpAccountant().curve(PureDpEvent(0.1))
    orders = RdpAccountant().orders
    assert curve == pytest.approx([min(0.1, a * 0.005) for a in orders])


def test_budget_monitor_admits_pure_events_then_halts():
    monitor = BudgetMonitor(1.0, 1e-5, PldAccountant(), MemoryLedger())
    assert [monitor.admit(PureDpEvent(0.4)) for _ in range(3)] == [0, 1, None]
    assert monitor.halted and monitor.spent() <= 1.0


def test_steps_of_different_events_with_the_same_epsilon_all_count():
    """Two events (here: pure DP under two adjacencies) with one per-step epsilon pool their
    counts; none is lost when their epsilons coincide."""
    acct = StrongCompositionAccountant(RdpAccountant())
    a, b = PureDpEvent(0.2), PureDpEvent(0.2, adjacency="add_remove")
    mixed = acct.epsilon_of_counts(acct.group([a] * 3 + [b] * 2), 1e-5)
    assert mixed == acct.epsilon_of_counts(acct.group([a] * 5), 1e-5) \
        > acct.epsilon_of_counts(acct.group([a] * 3), 1e-5)
    assert acct.epsilon_of_counts({}, 1e-5) == 0.0


def test_strong_composition_arguments_are_checked_at_their_boundaries():
    assert strong_composition_epsilon(0.0, 5, 1e-5) == 0.0 and strong_composition_epsilon(0.1, 0, 1e-5) == 0.0
    for eps0 in (-0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="eps0"):
            strong_composition_epsilon(eps0, 5, 1e-5)
    for k in (-1, True, 2.5):
        with pytest.raises(ValueError, match="k must be"):
            strong_composition_epsilon(0.1, k, 1e-5)
    for slack in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="delta_slack"):
            strong_composition_epsilon(0.1, 5, slack)
        with pytest.raises(ValueError, match="delta_slack"):
            heterogeneous_strong_epsilon({0.1: 5}, slack)
        with pytest.raises(ValueError, match="delta must be"):
            StrongCompositionAccountant(RdpAccountant()).epsilon_of_counts({PureDpEvent(0.1): 1}, slack)
    assert StrongCompositionAccountant(RdpAccountant(), (0.5,)).slack_fractions == (0.5,)
    for fractions in ((), (0.0,), (1.0,), (1.5,), (0.5, 1.0)):
        with pytest.raises(ValueError, match="slack_fractions"):
            StrongCompositionAccountant(RdpAccountant(), fractions)
