"""Paying ahead: the ledger write of the next steps runs in the background while records arrive,
and privacy rule 7 still holds for every step (its event is durable before it is admitted, so
before its noise), a failed write stops the next step before any noise, spent epsilon never
decreases and counts only durable steps, and a crash charges at most ``prepay`` unused steps."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from stream_vips.privacy.accountants import RdpAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import LedgerWriteError, MemoryLedger

EVENT = SubsampledGaussianEvent(noise_multiplier=3.0, sampling_rate=0.1, sampling="fixed")
OTHER = SubsampledGaussianEvent(noise_multiplier=4.0, sampling_rate=0.1, sampling="fixed")
STRIDE = 100


class SlowLedger(MemoryLedger):
    """A memory ledger whose writes take ``delay_s`` and can be made to fail; it records which
    thread wrote and how many entries were durable when each write began."""

    def __init__(self, delay_s: float = 0.05) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.fail = False
        self.writers: set[str] = set()
        self.lock = threading.Lock()

    def append_many(self, entries: list, **kw: Any) -> int:
        with self.lock:  # one writer at a time: the monitor must never write twice at once
            self.writers.add(threading.current_thread().name)
            time.sleep(self.delay_s)
            if self.fail:
                raise LedgerWriteError("disk full")
            return super().append_many(entries, **kw)


def monitor(ledger: Any, prepay: int = 1, budget: float = 50.0, **kw: Any) -> BudgetMonitor:
    return BudgetMonitor(budget, 1e-5, RdpAccountant(), ledger, prepay=prepay, stride=STRIDE, pay_ahead=True, **kw)


@pytest.mark.parametrize("prepay", [1, 3])
def test_every_admitted_step_is_durable_and_the_next_write_runs_in_the_background(prepay):
    ledger = SlowLedger(delay_s=0.05)
    m = monitor(ledger, prepay=prepay)
    spent = []
    for i in range(7):
        step = m.admit(EVENT, position=1000 + i * STRIDE)
        assert step == i
        assert len(ledger.events()) > step  # rule 7: the step's event is in the ledger when it is admitted
        assert ledger._positions[step] == 1000 + i * STRIDE
        spent.append(m.spent())
        time.sleep(0.08)  # arrivals until the next step: the write ahead finishes meanwhile
    assert all(b >= a for a, b in zip(spent, spent[1:]))
    assert "ledger-ahead_0" in ledger.writers  # the writes after the first ran on the writer thread
    assert len(ledger.events()) <= 7 + prepay  # a crash now would charge at most `prepay` unused steps
    m.settle()
    assert m.spent() == pytest.approx(RdpAccountant().epsilon(ledger.events(), 1e-5))


def test_a_step_waits_for_the_write_ahead_when_it_comes_early():
    ledger = SlowLedger(delay_s=0.2)
    m = monitor(ledger)
    assert m.admit(EVENT, position=0) == 0
    started = time.monotonic()
    assert m.admit(EVENT, position=STRIDE) == 1  # immediately: it waits for the write in flight
    assert time.monotonic() - started >= 0.15
    assert len(ledger.events()) >= 2
    m.settle()


def test_a_failed_write_ahead_stops_the_next_step_before_its_noise_and_spends_nothing_more():
    ledger = SlowLedger(delay_s=0.01)
    m = monitor(ledger)
    assert m.admit(EVENT, position=0) == 0
    before = m.spent()
    ledger.fail = True
    time.sleep(0.05)
    with pytest.raises(LedgerWriteError):
        m.admit(EVENT, position=STRIDE)
    assert m.spent() == before and len(ledger.events()) == 1 and m.steps == 1
    ledger.fail = False  # e.g. space freed: the next admission pays afresh, and counts right
    assert m.admit(EVENT, position=STRIDE) == 1
    m.settle()
    assert m.steps == len(ledger.events()) and m.spent() >= before


def test_a_changed_event_leaves_the_steps_paid_ahead_charged_and_pays_afresh():
    ledger = SlowLedger(delay_s=0.0)
    m = monitor(ledger, prepay=2)
    assert m.admit(EVENT, position=0) == 0
    assert m.admit(EVENT, position=STRIDE) == 1
    time.sleep(0.05)
    step = m.admit(OTHER, position=2 * STRIDE)  # steps 2, 3 were paid ahead for EVENT: unused
    assert step == 4
    assert [type(e) for e in ledger.events()[2:4]] == [SubsampledGaussianEvent] * 2
    assert ledger.events()[4].noise_multiplier == OTHER.noise_multiplier
    m.settle()
    assert m.spent() == pytest.approx(RdpAccountant().epsilon(ledger.events(), 1e-5))


def test_paying_ahead_never_writes_past_the_budget():
    one = RdpAccountant().epsilon([EVENT] * 5, 1e-5)
    budget = (one + RdpAccountant().epsilon([EVENT] * 6, 1e-5)) / 2  # 5 steps fit, 6 do not
    ledger = SlowLedger(delay_s=0.0)
    m = monitor(ledger, prepay=4, budget=budget)
    steps = [m.admit(EVENT, position=i * STRIDE) for i in range(8)]
    m.settle()
    assert steps[:5] == [0, 1, 2, 3, 4] and steps[5:] == [None] * 3
    assert len(ledger.events()) == 5 and m.halted
    assert m.spent() <= budget


def test_window_accounting_and_unknown_positions_do_not_pay_ahead():
    ledger = SlowLedger(delay_s=0.0)
    m = BudgetMonitor(50.0, 1e-5, RdpAccountant(), ledger, prepay=1, stride=None, pay_ahead=True)
    assert not m.pay_ahead
    windowed = BudgetMonitor(50.0, 1e-5, RdpAccountant(), MemoryLedger(), prepay=1, stride=STRIDE, window=5,
                             pay_ahead=True)
    assert not windowed.pay_ahead


def test_settle_lands_the_write_in_flight_before_the_ledger_closes():
    ledger = SlowLedger(delay_s=0.2)
    m = monitor(ledger)
    m.admit(EVENT, position=0)
    m.settle()  # returns only once the background write is in the ledger
    assert len(ledger.events()) == 2 and m.steps == 2
