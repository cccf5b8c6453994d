"""BudgetMonitor: every release is checked against the budget and durably in the ledger before
its noise is drawn (privacy rule 7 in docs/privacy.md).

>>> from stream_vips.privacy.accountants import RdpAccountant
>>> from stream_vips.privacy.events import SubsampledGaussianEvent
>>> from stream_vips.privacy.ledger import MemoryLedger
>>> monitor = BudgetMonitor(1.5, 1e-5, RdpAccountant(), MemoryLedger())
>>> step = SubsampledGaussianEvent(noise_multiplier=10.0, sampling_rate=1.0, sampling="fixed")
>>> [monitor.admit(step) for _ in range(4)]
[0, 1, 2, None]
>>> monitor.halted, monitor.spent() <= 1.5
(True, True)
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from stream_vips.privacy.accountants import Accountant
from stream_vips.privacy.event_types import Event
from stream_vips.privacy.ledger import Ledger

HEADROOM_WINDOW = 2**20


class BudgetMonitor:
    """Admits an event only if the composition with it stays within (epsilon_budget, delta).

    On construction the ledger is replayed (a restart never resets spent epsilon). ``admit``
    appends an event that fits to the ledger durably and returns its step index; the first
    event that would push epsilon over the budget is refused, nothing is appended, and the
    monitor halts for good with ``halt_reason`` set.

    The per-step check is O(1): for the current event the monitor asks the accountant once how
    many more copies fit (``Accountant.headroom``, searched up to ``HEADROOM_WINDOW`` copies so
    a huge budget never composes absurd counts) and then counts down, recomputing when a
    different event arrives or a full window is used up. Because headroom searches the
    accountant's own ``epsilon_of_counts`` and that is non-decreasing in the composition, this
    admits exactly the events that keep the reported epsilon,
    ``accountant.epsilon(ledger.events(), delta)`` (which ``spent()`` returns), within budget.

    Reported epsilon is an upper bound on the true one (for PLD: exact at a grid of counts,
    above it in between, see ``PldAccountant``), so the monitor halts no later than an exact
    check would; the budget it can leave unused is the report's overstatement at the halting
    step, at most epsilon(n (1 + 1/256) + 1) - epsilon(n) after n steps plus the
    discretization error (tested against the closed-form Gaussian). ``spent()`` and each
    admission cost O(1) amortised and bounded memory however long the ledger (a restart pays
    one accountant evaluation plus one headroom search).

    ``window`` (window accounting) and ``unit`` (``"key"``: per-person steps) are checked against
    what the ledger's steps were paid under; a ledger they would under-count raises
    ``LedgerMismatch`` before anything is appended.

    ``pay_ahead`` (stream accounting with a ``stride``; :meth:`start_paying_ahead` turns it on
    later): see :meth:`admit`. Call :meth:`settle` before closing the ledger.
    """

    def __init__(self, epsilon_budget: float, delta: float, accountant: Accountant, ledger: Ledger,
                 prepay: int = 1, stride: int | None = None, window: int | None = None,
                 unit: str = "record", pay_ahead: bool = False) -> None:
        if not epsilon_budget > 0 or not math.isfinite(epsilon_budget):
            raise ValueError(f"epsilon budget must be finite and > 0, got {epsilon_budget!r}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if isinstance(prepay, bool) or not isinstance(prepay, int) or prepay < 1:
            raise ValueError(f"prepay must be an integer >= 1, got {prepay!r}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        self.window = window
        self.prepay = prepay if stride else 1  # planned positions need a fixed stride
        self.stride = stride
        self._prepaid: deque[tuple[int, int | None]] = deque()  # (step, planned position)
        self._prepaid_unit = None
        self.pay_ahead = False
        if pay_ahead:
            self.start_paying_ahead()
        self.last_position: int | None = None  # a finite source's end: no step is paid ahead past it
        self._ahead: tuple[Future, Any, list, int] | None = None  # (write, unit, positions, copies) in flight
        self._writer: ThreadPoolExecutor | None = None
        self.epsilon_budget = float(epsilon_budget)
        self.delta = float(delta)
        self.accountant = accountant
        self.ledger = ledger
        events = ledger.events()
        if window:
            _check_windows(ledger, window)
        if unit == "key":
            _check_key_unit(ledger, events)
        self._counts: OrderedDict = accountant.group(events)
        self._recent = _Sliding(window - 1 if window else 0)
        self._window_eps: dict[tuple, float] = {}
        self._window_max = 0.0
        if window:
            self._replay_windows(events)
        self._steps = len(events)
        self._fit_unit = None
        self._fit_left = 0
        self._fit_window_full = False
        self._spent_cache: tuple[int, float] | None = None
        self.halted = False
        self.halt_reason: str | None = None
        spent = self.spent()
        if spent > self.epsilon_budget:
            self._halt(f"the ledger already holds epsilon {spent:.6g} > budget {self.epsilon_budget:g} "
                       f"at delta {self.delta:g} after {self._steps} steps")

    def start_paying_ahead(self) -> bool:
        """Pay ahead from now on where positions are known (stream accounting with a stride);
        whether it does."""
        self.pay_ahead = bool(self.stride and not self.window)
        return self.pay_ahead

    @property
    def steps(self) -> int:
        """Number of events in the ledger."""
        return self._steps

    def spent(self) -> float:
        """epsilon (at ``delta``) of everything in the ledger; one accountant evaluation, cached.
        With a ``window`` of L steps: the most any record has spent, the largest epsilon of L
        consecutive ledger steps (module docstring of :mod:`stream_vips.core.data.window`)."""
        if self.window:
            return self._window_max
        if self._spent_cache is None or self._spent_cache[0] != self._steps:
            self._spent_cache = (self._steps, self.accountant.epsilon_of_counts(self._counts, self.delta))
        return self._spent_cache[1]

    def would_spend(self, event: Event) -> float:
        """epsilon if ``event`` were added next."""
        self.accountant.check(event)
        trial = OrderedDict(self._counts)
        unit = event.unit()
        trial[unit] = trial.get(unit, 0) + event.count
        return self.accountant.epsilon_of_counts(trial, self.delta)

    def prepare(self, event: Event) -> None:
        """Compute how many more copies of ``event`` fit, unless the last search still holds (the
        one accountant search ``admit`` needs for a new kind of event). A pipeline calls it
        before consuming, so that the first update does not stall the loop for the search
        (seconds with PLD at large budgets)."""
        self.accountant.check(event)
        unit = event.unit()
        if unit == self._fit_unit and not (self._fit_left < event.count and self._fit_window_full):
            return  # the last search still holds for this event
        self._fit_left = self.accountant.headroom(self._counts, unit, self.delta, self.epsilon_budget,
                                                  limit=HEADROOM_WINDOW)
        self._fit_window_full = self._fit_left == HEADROOM_WINDOW
        self._fit_unit = unit

    def check_room(self, event: Event) -> bool:
        """Halt now if not even one more ``event`` fits the budget (a restart on a spent ledger:
        nothing can ever be released again, so a run should end the way a halt ends instead of
        waiting for a step to be refused); whether a step still fits. Under window accounting
        the budget renews as steps leave the window, so this never halts there."""
        if self.halted or self.window:
            return not self.halted
        self.prepare(event)
        if event.count > self._fit_left and not self._prepaid:
            self._halt(f"step {self._steps} would spend epsilon {self.would_spend(event):.6g} > budget "
                       f"{self.epsilon_budget:g} at delta {self.delta:g} (the ledger's {self._steps} steps leave no "
                       "room for another)")
        return not self.halted

    def admit(self, event: Event, position: int | None = None) -> int | None:
        """Check ``event``, append it durably if it fits and return its step index; else halt.

        ``position`` is the stream position the step is taken at, recorded in the ledger so a
        restart from a checkpoint never pays twice at one position.

        **Prepaid steps.** With ``prepay = k > 1`` (and a ``stride``: steps every ``stride``
        arrivals, so their positions are known in advance) one durable write appends the next k
        copies of the event at positions ``position + j * stride``, as far as the budget allows,
        and the following admissions of the same event use them without I/O. The order of
        privacy rule 7 holds for every step: each release's event is in the ledger before its
        noise is drawn (earlier than needed, never later). A crash charges the unused prepaid
        steps (at most k - 1): the ledger may over-count, never under-count, and the spent
        epsilon reported includes them. Under window accounting a step at another position than
        its prepaid one pays afresh there (the prepaid steps stay charged, unused): the window
        bound reads positions.

        **Paying ahead** (``pay_ahead``). Once a step has used the last prepaid entry, the write of
        the next ``prepay`` steps (as far as the budget allows) starts on a background thread, so
        it overlaps the arrivals until the next step instead of stalling them. The next
        admission waits for that write and uses its entries only once it is durable, so privacy
        rule 7 holds as before: no noise is drawn for a step whose event is not in the ledger. A
        failed write raises at that admission, before any noise. Spent epsilon counts a write
        once it is durable. A crash charges at most ``prepay`` unused steps (one more than
        without paying ahead); with the default ``prepay_steps`` that is at most 1% of the
        planned steps, or one step.

        Returns None when halted (now or before). An event the accountant cannot bound raises
        ``UnsupportedEvent`` (a configuration error, not a budget decision).
        """
        if self.halted:
            return None
        if self.window:
            return self._admit_windowed(event, position)
        unit = event.unit()
        self._land_ahead()
        prepaid = self._take_prepaid(unit, None)  # every release has its own entry: positions only save replays
        if prepaid is not None:
            self._pay_ahead(event, position)
            return prepaid
        self.prepare(event)
        if event.count > self._fit_left:
            self._halt(f"step {self._steps} would spend epsilon {self.would_spend(event):.6g} > budget "
                       f"{self.epsilon_budget:g} at delta {self.delta:g}")
            return None
        k = min(self.prepay, self._fit_left // event.count)
        stride = self.stride or 0
        positions = [None if position is None else position + j * stride for j in range(k)]
        first = self.ledger.append_many([(event, p) for p in positions])
        self._counts[unit] = self._counts.get(unit, 0) + k * event.count
        self._fit_left -= k * event.count
        self._steps += k
        self._keep_prepaid(unit, first, positions)
        self._pay_ahead(event, position)
        return first

    def _pay_ahead(self, event: Event, position: int | None) -> None:
        """With ``pay_ahead``, once no prepaid step is left: start the durable write of the next
        ``prepay`` steps after ``position`` (as far as the budget allows) on the writer thread.
        Their epsilon is reserved now (``_fit_left``) and counted as spent once written."""
        if not self.pay_ahead or self._prepaid or self._ahead is not None or position is None:
            return
        self.prepare(event)
        k = min(self.prepay, self._fit_left // event.count)
        if k < 1:
            return  # nothing more fits: the next admission halts
        positions = [p for p in (position + j * self.stride for j in range(1, k + 1))
                     if self.last_position is None or p <= self.last_position]
        if not positions:
            return  # the source ends before the next step
        k = len(positions)
        self._fit_left -= k * event.count
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-ahead")
        write = self._writer.submit(self.ledger.append_many, [(event, p) for p in positions])
        self._ahead = (write, event.unit(), positions, k * event.count)

    def _land_ahead(self) -> None:
        """Wait for the write in flight (if any) and take its steps as prepaid; its error (a full
        disk, a lost broker) is raised here, before this step draws any noise."""
        if self._ahead is None:
            return
        write, unit, positions, count = self._ahead
        self._ahead = None
        try:
            first = write.result()
        except BaseException:
            self._fit_unit = None  # the reserved epsilon was not spent: search the headroom again
            raise
        self._counts[unit] = self._counts.get(unit, 0) + count
        self._steps += len(positions)
        self._prepaid.clear()
        self._prepaid.extend(zip(range(first, first + len(positions)), positions))
        self._prepaid_unit = unit

    def settle(self) -> None:
        """Wait for a write in flight and stop the writer thread (before the ledger is closed);
        a failed write is left unreported here: nothing was released on it."""
        try:
            self._land_ahead()
        except Exception:
            pass
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None

    def _keep_prepaid(self, unit: Event, first: int, positions: list[int | None]) -> None:
        """Remember steps ``first + 1, ...`` as paid ahead, at the planned ``positions[1:]``."""
        self._prepaid.extend(zip(range(first + 1, first + len(positions)), positions[1:]))
        self._prepaid_unit = unit

    def _take_prepaid(self, unit: Event, position: int | None) -> int | None:
        """The next prepaid step, if it was paid for this kind of event at this ``position``
        (``None``: any position); else the prepaid steps stay charged, unused, and ``None`` (a
        fresh step is paid). Under window accounting a step taken later than planned (one held
        back while a publish failed) must not use the planned position: the ledger would place it
        too early, and a restart could then step again sooner than the window allows."""
        if not self._prepaid:
            return None
        step, planned = self._prepaid[0]
        if self._prepaid_unit == unit and (position is None or planned is None or position == planned):
            self._prepaid.popleft()
            return step
        self._prepaid.clear()
        return None

    # -- window (per-record) accounting ---------------------------------------------------------

    def _window_epsilon(self, counts: Mapping[Event, int]) -> float:
        """epsilon of one window's composition (cached by it: identical windows cost one accountant
        evaluation, however long the ledger; composition does not depend on the order of steps)."""
        key = tuple(sorted(((repr(u), n) for u, n in counts.items() if n)))
        if key not in self._window_eps:
            if len(self._window_eps) > 4096:
                self._window_eps.clear()
            self._window_eps[key] = self.accountant.epsilon_of_counts(
                OrderedDict((u, n) for u, n in counts.items() if n), self.delta)
        return self._window_eps[key]

    def _replay_windows(self, events: list[Event]) -> None:
        """The largest window epsilon over the ledger, and the last L - 1 steps for the next
        check; O(1) per event (a sliding count), an accountant call only for a new composition."""
        window = _Sliding(self.window)
        for event in events:
            self.accountant.check(event)
            window.push(event.unit())
            self._window_max = max(self._window_max, self._window_epsilon(window.counts))
        for unit in list(window.units)[-(self.window - 1):] if self.window > 1 else []:
            self._recent.push(unit)
        if self._window_max > self.epsilon_budget:
            self._halt(f"the ledger already holds {self.window} consecutive steps with epsilon "
                       f"{self._window_max:.6g} > budget {self.epsilon_budget:g} at delta {self.delta:g}")

    def _admit_windowed(self, event: Event, position: int | None) -> int | None:
        """Admit ``event`` if every record it can touch stays within budget: the last L - 1 steps
        plus this one compose to at most epsilon (prepaid steps are checked one by one)."""
        self.accountant.check(event)
        unit = event.unit()
        prepaid = self._take_prepaid(unit, position)
        if prepaid is not None:
            return prepaid
        recent = self._recent.copy()
        stride = self.stride or 0
        entries: list = []
        worst = self._window_max
        while len(entries) < self.prepay:
            eps = self._window_epsilon(recent.with_unit(unit))
            if eps > self.epsilon_budget:
                break
            entries.append((event, None if position is None else position + len(entries) * stride))
            worst = max(worst, eps)
            recent.push(unit)
        if not entries:
            self._halt(f"step {self._steps} would make {self.window} consecutive steps spend epsilon "
                       f"{self._window_epsilon(self._recent.with_unit(unit)):.6g} > budget "
                       f"{self.epsilon_budget:g} at delta {self.delta:g}")
            return None
        first = self.ledger.append_many(entries, window=self.window)  # durable first: a failed append changes nothing
        self._recent, self._window_max = recent, worst
        self._counts[unit] = self._counts.get(unit, 0) + len(entries) * event.count
        self._steps += len(entries)
        self._keep_prepaid(unit, first, [p for _, p in entries])
        return first

    def _halt(self, reason: str) -> None:
        self.halted = True
        self.halt_reason = reason


def _check_key_unit(ledger: Ledger, events: list[Event]) -> None:
    """Refuse to continue at key level (privacy rule 12) a ledger that holds steps paid per record.

    A record-unit step bounds one record's change of the released sum; a person with k records
    in the reservoir changes it by up to k times that, so by group privacy those steps cost such a
    person far more than their epsilon, and composing them as if they were key-level would
    under-count. The other way is sound (a record is part of one key's records), so a record-unit
    run may continue a key-level ledger."""
    from .ledger import LedgerMismatch

    per_record = sum(getattr(e, "privacy_unit", "record") != "key" for e in events)
    if per_record:
        raise LedgerMismatch(
            f"ledger {ledger.ledger_id} holds {per_record} steps not marked as key-level (paid per record, or "
            "written before stream_vips marked the unit of a step), but privacy.unit is key: a per-record step "
            "bounds one record, not a person with several, so continuing would under-count; keep "
            "privacy.unit: record for this ledger, or run `stream-vips reset` to start a new budget deliberately")


def _check_windows(ledger: Ledger, window: int) -> None:
    """Refuse to account ``ledger`` with windows of ``window`` steps when an earlier life paid a
    step under a longer window, or under stream accounting (its records could be in every step):
    fewer steps per window would lower the epsilon it reports. A longer window than before only
    over-counts and is accepted."""
    from .ledger import LedgerMismatch

    recorded = ledger.windows()
    stream = sum(w is None for w in recorded)
    if stream:
        raise LedgerMismatch(
            f"ledger {ledger.ledger_id} holds {stream} steps taken under stream accounting (a record could be "
            f"in every one of them), but privacy.accounting is window ({window} steps): that would count only "
            "the last steps and lower the spent epsilon; keep privacy.accounting: stream for this ledger, or "
            "run `stream-vips reset` to start a new budget deliberately")
    longest = max(recorded, default=window)
    if longest > window:
        raise LedgerMismatch(
            f"ledger {ledger.ledger_id} holds steps paid under a window of {longest} steps, but this "
            f"configuration's window is {window} (sampling.reservoir / schedule.every_records changed): a record "
            f"may be in {longest} consecutive steps, so counting {window} would lower the spent epsilon; keep a "
            "window of at least that many steps, or run `stream-vips reset` to start a new budget deliberately")


class _Sliding:
    """The last ``size`` step units and their counts, updated in O(1) per step."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.units: deque[Event] = deque()
        self.counts: dict[Event, int] = {}

    def push(self, unit: Event) -> None:
        if self.size == 0:
            return
        self.units.append(unit)
        self.counts[unit] = self.counts.get(unit, 0) + unit.count
        if len(self.units) > self.size:
            old = self.units.popleft()
            self.counts[old] -= old.count

    def with_unit(self, unit: Event) -> dict[Event, int]:
        """The counts of these units plus one more ``unit`` (not stored)."""
        counts = dict(self.counts)
        counts[unit] = counts.get(unit, 0) + unit.count
        return counts

    def copy(self) -> _Sliding:
        other = _Sliding(self.size)
        other.units, other.counts = deque(self.units), dict(self.counts)
        return other
