"""The sliding-window reservoir and per-record (window) accounting: a service that keeps learning."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from stream_vips import ConfigError, PrivateLearner
from stream_vips.core.data.window import WindowReservoir, window_steps
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import MemoryLedger

DELTA = 1e-5


def test_the_sliding_window_holds_exactly_the_last_m_arrivals_whatever_the_batching():
    rng = np.random.default_rng(1)
    for _ in range(300):
        m, n = int(rng.integers(1, 9)), int(rng.integers(0, 50))
        values, ok = np.arange(n, dtype=float), rng.random(n) < 0.8
        res = WindowReservoir({"x": (np.float64, ())}, m, np.random.default_rng(0))
        i = 0
        while i < n:
            j = min(n, i + int(rng.integers(1, 12)))
            res.add_batch({"x": values[i:j][ok[i:j]]}, accepted=ok[i:j])
            i = j
        held = sorted(res.columns["x"][res.valid].tolist())
        assert held == [float(v) for v in range(max(0, n - m), n) if ok[v]]  # rejected ones leave a gap
        assert res.seen == n and res.size == min(n, m) and res.full == (n >= m)


def test_sampled_window_membership_depends_on_positions_and_rng_only():
    """Two streams that differ in one record's value keep every other record in the same slot."""
    a, b = np.arange(200.0), np.arange(200.0)
    b[37] = -5.0
    ra = WindowReservoir({"x": (np.float64, ())}, 20, np.random.default_rng(7), rate=0.3)
    rb = WindowReservoir({"x": (np.float64, ())}, 20, np.random.default_rng(7), rate=0.3)
    for lo in range(0, 200, 17):
        ra.add_batch({"x": a[lo:lo + 17]})
        rb.add_batch({"x": b[lo:lo + 17]})
        same = ra.columns["x"] == rb.columns["x"]
        assert np.all(same | (ra.columns["x"] == 37.0))  # only the replaced record's own slot differs
    assert ra.get_state()["admitted"] == rb.get_state()["admitted"] < 200 * 0.4


def test_window_steps_and_rate_refuse_values_outside_their_range():
    assert window_steps(1, 1) == 1 and window_steps(7, 2) == 4
    for capacity, every in ((0, 5), (5, 0), (-1, 1)):
        with pytest.raises(ValueError, match="capacity and every_records"):
            window_steps(capacity, every)
    for rate in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="rate"):
            WindowReservoir({"x": (np.float64, ())}, 3, np.random.default_rng(0), rate=rate)


def test_a_sampled_window_restores_exactly_and_refuses_a_state_that_is_not_its_own():
    """A sampled window that admitted fewer than M arrivals (of more than M seen) fills only the
    admitted slots on restore; a state without the window's ring or rate is refused."""
    layout = {"x": (np.float64, ())}
    res = WindowReservoir(layout, 8, np.random.default_rng(3), rate=0.25)
    res.add_batch({"x": np.arange(20.0)})
    state = res.get_state()
    assert state["admitted"] < 8 < state["seen"]  # the case that needs min(admitted, M), not seen
    back = WindowReservoir(layout, 8, np.random.default_rng(99), rate=0.25)
    back.set_state(state)
    assert (back.size, back.seen, back.full) == (res.size, res.seen, res.full) == (state["admitted"], 20, False)
    assert back.columns["x"].tolist() == res.columns["x"].tolist() and back.valid.tolist() == res.valid.tolist()
    back.add_batch({"x": np.arange(20.0, 60.0)})
    res.add_batch({"x": np.arange(20.0, 60.0)})
    assert back.get_state()["admitted"] == res.get_state()["admitted"]
    assert back.columns["x"].tolist() == res.columns["x"].tolist()  # same draws after the restore
    plain = {k: v for k, v in state.items() if k not in ("admitted", "rate")}
    for bad in (plain, {**state, "rate": 0.5}, {k: v for k, v in state.items() if k != "rate"}):
        with pytest.raises(ValueError, match="not a window reservoir"):
            WindowReservoir(layout, 8, np.random.default_rng(0), rate=0.25).set_state(bad)
    full_rate = WindowReservoir(layout, 8, np.random.default_rng(0))
    with pytest.raises(ValueError, match="not a window reservoir"):
        full_rate.set_state({**plain, "admitted": 5})  # no rate recorded: not taken for rate 1


@pytest.mark.parametrize("m, k", [(10, 1), (10, 3), (10, 10), (12, 5), (4, 9)])
def test_a_record_is_in_at_most_l_steps_and_some_record_in_exactly_l(m, k):
    """Steps every k arrivals once full (the pipeline's trigger): count, for each arrival, the steps
    whose window holds it."""
    res = WindowReservoir({"x": (np.float64, ())}, m, np.random.default_rng(0))
    counts = np.zeros(400, dtype=int)
    pending = 0
    for pos in range(400):
        res.add_batch({"x": np.array([float(pos)])})
        pending += 1
        if res.full and pending >= k:
            counts[res.columns["x"].astype(int)] += 1
            pending = 0
    assert counts.max() == window_steps(m, k) == math.ceil(m / k)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon(delta) of the Gaussian mechanism with sensitivity / noise = mu."""
    def gap(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta
    return brentq(gap, 0.0, 100.0)


def test_window_accounting_matches_the_closed_form_of_a_record_in_exactly_l_steps():
    """q = 1: each step is a Gaussian mechanism with noise z C and replace-one sensitivity 2 C, so
    a record in L steps is one Gaussian mechanism with mu = 2 sqrt(L) / z. The monitor admits
    steps forever when that fits the budget and refuses the L-th step when it does not."""
    z, window = 6.0, 8
    event = SubsampledGaussianEvent(z, 1.0, "poisson")
    closed = gaussian_epsilon(2 * math.sqrt(window) / z, DELTA)
    pld = make_accountant("pld", "poisson")
    ledger = MemoryLedger()
    monitor = BudgetMonitor(closed * 1.01, DELTA, pld, ledger, window=window)
    assert [monitor.admit(event) for _ in range(10 * window)] == list(range(10 * window))
    assert closed <= monitor.spent() <= closed * 1.01  # an upper bound within the grid's tolerance
    restarted = BudgetMonitor(closed * 1.01, DELTA, pld, ledger, window=window)
    assert restarted.spent() == monitor.spent() and restarted.admit(event) == 10 * window
    tight = BudgetMonitor(closed * 0.99, DELTA, pld, MemoryLedger(), window=window)
    assert [tight.admit(event) for _ in range(window)] == [*range(window - 1), None] and tight.halted


def test_a_window_of_heterogeneous_steps_checks_the_worst_l_consecutive():
    acct = make_accountant("pld", "poisson")
    loose, strong = SubsampledGaussianEvent(20.0, 1.0, "poisson"), SubsampledGaussianEvent(4.0, 1.0, "poisson")
    budget = acct.epsilon([strong, strong, loose], DELTA) * 1.001
    monitor = BudgetMonitor(budget, DELTA, acct, MemoryLedger(), window=3)
    admitted = [monitor.admit(e) for e in (strong, loose, strong, strong)]  # windows hold 2 s + 1 l at most
    assert admitted == [0, 1, 2, 3] and acct.epsilon([strong, loose, strong, strong], DELTA) > budget
    assert monitor.admit(strong) is None  # (s, s, s): three strong steps would hold one record


def stream(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-0.5, 0.5, (n, 2))
    return X, X @ np.array([0.5, -0.5]) + 0.05 * rng.standard_normal(n)


def test_a_window_service_keeps_learning_while_stream_accounting_halts():
    options = dict(dim=2, epsilon=1.0, reservoir=1000, batch_size=500, every_records=250, planned_steps=8, seed=3)
    halting = PrivateLearner("linreg", **options).learn_many(stream(20_000))
    assert halting.halted and halting.steps_taken == 8
    window = PrivateLearner("linreg", reservoir_policy="window", accounting="window", rho_min=0.2,
                            **options).learn_many(stream(20_000))
    assert not window.halted and window.steps_taken == (20_000 - 1000) // 250 + 1  # every trigger point
    assert window.window_steps == 4 and window.epsilon_spent <= 1.0
    report = window.privacy_report()
    assert report["accounting"] == "window" and report["window_steps"] == 4
    assert halting.privacy_report()["accounting"] == "stream"


def test_window_accounting_needs_a_sliding_window_and_a_record_schedule():
    with pytest.raises(ConfigError, match="privacy.accounting: window accounting needs"):
        PrivateLearner("linreg", dim=2, accounting="window")  # uniform reservoir
    with pytest.raises(ConfigError, match="privacy.accounting"):
        PrivateLearner("linreg", dim=2, accounting="window", reservoir_policy="window", window_rate=0.5)
    with pytest.raises(ConfigError, match="privacy.accounting"):
        PrivateLearner("linreg", dim=2, accounting="window", reservoir_policy="window", every_seconds=5.0,
                       every_records=None)


def test_a_failed_append_changes_nothing_in_window_accounting():
    class FullDisk(MemoryLedger):
        def append_many(self, entries, window=None):
            raise OSError(28, "No space left on device")

    monitor = BudgetMonitor(5.0, DELTA, make_accountant("pld", "poisson"), FullDisk(), window=4, prepay=3, stride=10)
    with pytest.raises(OSError):
        monitor.admit(SubsampledGaussianEvent(3.0, 1.0, "poisson"), position=100)
    assert monitor.steps == 0 and monitor.spent() == 0.0 and not monitor._recent.units
