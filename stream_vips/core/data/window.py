"""A sliding-window reservoir and the per-record (window) accounting it makes possible.

**The window.** :class:`WindowReservoir` keeps the last M admitted arrivals in a ring of M slots:
arrival ``i`` (0-based, counted over admitted arrivals) goes to slot ``i mod M`` and evicts the
arrival M before it. With ``rate = 1`` every arrival is admitted (a sliding window of the last M
arrivals); with ``rate < 1`` each arrival is admitted with probability ``rate`` by the window's
own random generator (a sampled window). Either way membership depends on arrival positions
and the RNG only, never on record values (privacy rule 1), and a record holds at most one slot.
Rejected arrivals take their position and leave their slot empty, as in the uniform reservoir.

**Why the window bounds every record's privacy loss** (``privacy.accounting: window``). With
``rate = 1`` and a step every k arrivals, the record at arrival position p is in the reservoir
for exactly the steps taken after p + 1 and up to p + M arrivals: at most ``L = ceil(M / k)``
steps. Fix a record and two neighbouring streams that differ only in it. Every step that does
not contain the record releases, given everything released before, the same distribution on
both streams (its batch is drawn from reservoir contents that agree, by the same sampler; later
steps only post-process earlier releases through the model state). By adaptive composition the
record's privacy loss is therefore the composition of the at most L subsampled Gaussian steps
that contain it, whatever happens in the other steps; each of those is a step the ledger holds,
with its own q (the per-step q bound is unchanged: q is over the M slots). So the budget holds
for every record when the composition of any L consecutive ledger steps stays within it, which
:class:`~stream_vips.privacy.budget.BudgetMonitor` checks with ``window = L``. The service then
never has to halt for its budget while the steps stay the same.

**What it does not cover.** A person who sends records forever pays per record: each record is
protected at epsilon, a person with many records in one window at roughly their count times
epsilon (per-person bounds are ``privacy.unit: key``'s business). The sampled window
(``rate < 1``) has a random residence time, so it is used with stream accounting only.

>>> import numpy as np
>>> res = WindowReservoir({"x": (np.float64, ())}, capacity=3, rng=np.random.default_rng(0))
>>> res.add_batch({"x": np.arange(5.0)})
>>> res.columns["x"].tolist(), res.seen, res.full
([3.0, 4.0, 2.0], 5, True)
>>> window_steps(capacity=10_000, every_records=1_000)
10
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from stream_vips.core.data.reservoir import Admission, Layout, Reservoir, _copy


def window_steps(capacity: int, every_records: int) -> int:
    """L: the most steps one record can be in, for a sliding window of ``capacity`` arrivals and
    a step every ``every_records`` arrivals."""
    if capacity < 1 or every_records < 1:
        raise ValueError("capacity and every_records must be >= 1")
    return math.ceil(capacity / every_records)


class WindowReservoir(Reservoir):
    """The last M admitted arrivals (module docstring); the same interface as :class:`Reservoir`."""

    def __init__(self, layout: Layout, capacity: int, rng: np.random.Generator, rate: float = 1.0) -> None:
        super().__init__(layout, capacity, rng)
        if not 0.0 < float(rate) <= 1.0:
            raise ValueError(f"window admission rate must be in (0, 1], got {rate!r}")
        self.rate = float(rate)
        self._admitted = 0

    @property
    def size(self) -> int:
        return min(self._admitted, self._capacity)

    @property
    def full(self) -> bool:
        return self._admitted >= self._capacity

    def admit(self, n: int) -> Admission:
        """The arrivals of the next ``n`` that will hold a slot after them (the last M admitted),
        drawing what :meth:`add_batch` draws (:meth:`Reservoir.admit`)."""
        if self._pending is not None:
            raise RuntimeError("an admission is pending: place() it before admitting more arrivals")
        n = int(n)
        admitted = np.arange(n) if self.rate == 1.0 else np.flatnonzero(self._rng.random(n) < self.rate)
        m, base, count = self._capacity, self._admitted, admitted.size
        slots = (base + np.arange(count)) % m
        if count > m:  # the earlier ones are overwritten within this batch
            admitted, slots = admitted[-m:], slots[-m:]
        self._pending = Admission(self._seen, n, admitted, slots, ring=base + count)
        return self._pending

    def candidates(self, n: int) -> np.ndarray | None:
        """The arrivals among the next ``n`` that the window admits (a superset of what
        :meth:`admit` names, however they are batched), from a copy of the generator."""
        if self.rate == 1.0:
            return np.arange(int(n))
        return np.flatnonzero(_copy(self._rng).random(int(n)) < self.rate)

    def _store(self, admission: Admission, good: np.ndarray, rows: Mapping[str, np.ndarray],
               src: np.ndarray) -> None:
        super()._store(admission, good, rows, src)
        self._admitted = int(admission.ring)  # type: ignore[arg-type]

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue exactly (the window's position in its ring included)."""
        return {**super().get_state(), "admitted": self._admitted, "rate": self.rate}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`get_state` (same layout, capacity and rate)."""
        if "admitted" not in state or float(state.get("rate", -1)) != self.rate:
            raise ValueError("reservoir state is not a window reservoir with this admission rate")
        admitted = int(state["admitted"])
        super().set_state({**state, "seen": min(admitted, self._capacity)})  # fills min(admitted, M) slots
        self._admitted = admitted
        self._seen = int(state["seen"])
