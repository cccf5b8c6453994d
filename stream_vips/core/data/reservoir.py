"""A bounded, uniform reservoir of preprocessed records (Algorithm R over numpy columns).

Every record the stream has delivered so far is in the reservoir with the same probability
``min(1, M / seen)``. Which records are kept is decided from arrival positions and the reservoir's
own random generator only, never from record values (privacy rule 1 in docs/privacy.md): two streams that
differ in one record's content, read with the same seed, keep exactly the same positions. Records
are stored as rows of preallocated numpy arrays (one per column of ``Model.row_layout()``), so
memory is fixed at construction and no Python object per record is retained.

Rejected records. Whether a record passes validation depends on its value, so a rejected record
must still consume its arrival position, or every later decision would shift between neighbouring
streams. ``add_batch(rows, accepted=mask)`` takes the mask over all arrivals of a poll: a rejected
arrival that wins a slot leaves it empty (a null record). :meth:`take` skips empty slots, so a
null record contributes zero to every sum, which is within any per-record bound; with the public
normalisers (q*M or S) the analysis is unchanged.

Admission before decoding (``sampling.validation: admitted``). Because membership is a function
of positions and the generator only, :meth:`Reservoir.admit` can decide, before any record of a
batch is read, which arrivals will hold a slot after it (the last one per slot), drawing exactly
what :meth:`Reservoir.add_batch` draws; :meth:`Reservoir.place` then stores just those, so
``add_batch`` is ``admit`` + ``place`` and both paths leave the same rows, validity, ``seen``
and generator state. The privacy argument is unchanged: (1) admission reads no record, so it is
identical for neighbouring streams, and a record holds at most one slot as before; (2) a rejected
admitted arrival empties its slot (the null record) exactly as with ``add_batch``, and since
later admissions depend on positions and draws only, a rejection never shifts them (a stream with
bad records admits the same positions as a clean one, given the seed); (3) an arrival that is not
admitted could not be in any release, so not reading it changes no release. The only new public
fact is which admitted positions were rejected, a subset of what validating every record makes
public (privacy rule 1). :meth:`Reservoir.candidates` gives a superset of the arrivals any
batching can admit, from a copy of the generator, so a caller decodes them in one pass.

>>> import numpy as np
>>> res = Reservoir({"x": (np.float64, (2,))}, capacity=3, rng=np.random.default_rng(0))
>>> res.add_batch({"x": np.arange(10.0).reshape(5, 2)})
>>> res.size, res.seen, res.full
(3, 5, True)
>>> admission = res.admit(6)  # positions 5..10: only these three arrivals will hold a slot
>>> admission.arrivals.tolist(), admission.slots.tolist()
([1, 2, 5], [1, 2, 0])
>>> res.place(admission, {"x": np.ones((3, 2))})
>>> res.seen
11
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

Layout = Mapping[str, tuple[Any, tuple[int, ...]]]


@dataclass(frozen=True)
class Admission:
    """The arrivals of a batch whose content a reservoir will keep, decided before any is read.

    ``start``: arrival positions consumed before the batch; ``n``: arrivals in it; ``arrivals``:
    ascending indices into the batch of the arrivals that hold a slot after it (the last one per
    slot); ``slots``: their slots. A window reservoir adds ``ring``, its admitted count after the
    batch; a key reservoir adds ``renewed``, the key slots whose tenure restarts in it.
    """

    start: int
    n: int
    arrivals: np.ndarray
    slots: np.ndarray
    ring: int | None = None
    renewed: np.ndarray | None = None


def _copy(rng: np.random.Generator) -> np.random.Generator:
    """A generator in the same state as ``rng`` (advancing it leaves ``rng`` alone)."""
    bit_generator = type(rng.bit_generator)(0)
    bit_generator.state = rng.bit_generator.state
    return np.random.Generator(bit_generator)


def admitted_mask(admission: Admission, n_rows: int, accepted: np.ndarray | None) -> np.ndarray:
    """``accepted`` (a mask over ``admission.arrivals``, default all) checked against ``n_rows``."""
    count = admission.arrivals.size
    good = np.ones(count, dtype=bool) if accepted is None else np.asarray(accepted, dtype=bool)
    if good.shape != (count,) or int(good.sum()) != n_rows:
        raise ValueError(f"accepted mask has {int(good.sum())} True entries of {good.size} for {n_rows} rows "
                         f"and {count} admitted arrivals")
    return good


@runtime_checkable
class ReservoirLike(Protocol):
    """What the engine and the learner read of any reservoir (uniform, window, key slots): its
    public size and fill, the validity of its slots, the rows of sampled slots and a state to
    checkpoint. Membership is decided by positions and a generator only (privacy rule 1);
    ``add_batch`` and ``admit`` differ by policy (key slots take the arrivals' keys)."""

    @property
    def capacity(self) -> int: ...

    @property
    def seen(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def full(self) -> bool: ...

    @property
    def valid(self) -> np.ndarray: ...

    @property
    def layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]: ...

    def candidates(self, n: int) -> np.ndarray | None: ...

    def get_state(self) -> dict[str, Any]: ...

    def set_state(self, state: Mapping[str, Any]) -> None: ...


class Reservoir:
    """Algorithm R with whole-batch, vectorized replacement decisions.

    For the record at 0-based arrival position ``p``: if ``p < M`` it fills slot ``p``; otherwise
    a slot index ``j`` is drawn uniformly from ``{0, ..., p}`` and the record replaces slot ``j``
    when ``j < M``. A whole batch draws its ``j``'s in one call from the positions alone; when
    several records of one batch hit the same slot the latest one wins, exactly as if they had
    been inserted one by one.
    """

    def __init__(self, layout: Layout, capacity: int, rng: np.random.Generator) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"reservoir capacity must be a positive integer, got {capacity!r}")
        if not layout:
            raise ValueError("reservoir layout must name at least one column")
        if not isinstance(rng, np.random.Generator):
            raise TypeError("reservoir rng must be a numpy.random.Generator")
        self._capacity = int(capacity)
        self._layout = {name: (np.dtype(dt), tuple(shape)) for name, (dt, shape) in layout.items()}
        self._cols = {
            name: np.zeros((self._capacity, *shape), dtype=dt)
            for name, (dt, shape) in self._layout.items()
        }
        self._valid = np.zeros(self._capacity, dtype=bool)
        self._rng = rng
        self._seen = 0
        self._pending: Admission | None = None

    @property
    def capacity(self) -> int:
        """M, the public number of slots."""
        return self._capacity

    @property
    def seen(self) -> int:
        """Number of records offered so far (arrival positions consumed)."""
        return self._seen

    @property
    def size(self) -> int:
        """Number of filled slots, ``min(seen, capacity)``."""
        return min(self._seen, self._capacity)

    @property
    def full(self) -> bool:
        """True once every slot is filled; no release may happen before (privacy rule 5 in docs/privacy.md)."""
        return self._seen >= self._capacity

    @property
    def layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return dict(self._layout)

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """Read-only views of the filled slots, one array per column (empty slots hold zeros)."""
        out = {}
        for name, col in self._cols.items():
            view = col[: self.size]
            view.flags.writeable = False
            out[name] = view
        return out

    @property
    def valid(self) -> np.ndarray:
        """Read-only mask over filled slots: False where a rejected arrival left the slot empty."""
        view = self._valid[: self.size]
        view.flags.writeable = False
        return view

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage (constant after construction)."""
        return sum(col.nbytes for col in self._cols.values()) + self._valid.nbytes

    def take(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of the records in slots ``indices`` (below :attr:`size`); empty slots are skipped."""
        idx = np.asarray(indices, dtype=np.intp)
        if idx.ndim != 1:
            raise ValueError("reservoir indices must be one-dimensional")
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise IndexError(f"reservoir index out of range [0, {self.size})")
        idx = idx[self._valid[idx]]
        return {name: col[idx] for name, col in self._cols.items()}

    def _check_rows(self, rows: Mapping[str, np.ndarray]) -> int:
        if set(rows) != set(self._layout):
            raise ValueError(
                f"reservoir rows have columns {sorted(rows)}, layout expects {sorted(self._layout)}"
            )
        n = None
        for name, (_, shape) in self._layout.items():
            arr = np.asarray(rows[name])
            if arr.shape[1:] != shape:
                raise ValueError(
                    f"reservoir column {name!r}: per-record shape {arr.shape[1:]}, expected {shape}"
                )
            if n is None:
                n = arr.shape[0]
            elif arr.shape[0] != n:
                raise ValueError("reservoir columns of one batch must have the same number of rows")
        return int(n or 0)

    def admit(self, n: int) -> Admission:
        """Which of the next ``n`` arrivals will hold a slot after them, from positions and the RNG.

        Draws exactly what :meth:`add_batch` would draw for ``n`` arrivals, so the two paths
        consume the generator identically; :meth:`place` must follow before the next call. The
        result never depends on record values: it is computed before any is decoded.
        """
        if self._pending is not None:
            raise RuntimeError("an admission is pending: place() it before admitting more arrivals")
        n, m, start = int(n), self._capacity, self._seen
        # Arrivals that fill empty slots: slot = position. Then Algorithm R from positions only.
        n_fill = max(0, min(n, m - start))
        arrivals = np.arange(n_fill)
        slots = start + arrivals
        if n_fill < n:
            positions = np.arange(start + n_fill, start + n, dtype=np.int64)
            draws = self._rng.integers(0, positions + 1)  # uniform on {0..p}
            hit = np.flatnonzero(draws < m)
            arrivals = np.concatenate([arrivals, n_fill + hit])
            slots = np.concatenate([slots, draws[hit]])
            # The last arrival per slot wins: unique() on the reversed order finds it.
            _, first_rev = np.unique(slots[::-1], return_index=True)
            last = np.sort(slots.size - 1 - first_rev)  # in arrival order
            arrivals, slots = arrivals[last], slots[last]
        self._pending = Admission(start, n, arrivals, slots)
        return self._pending

    def candidates(self, n: int) -> np.ndarray | None:
        """A superset of the arrivals among the next ``n`` that :meth:`admit` can name, however
        they are cut into batches: the filling ones and every one whose draw hits a slot. Drawn
        from a copy of the generator, so the reservoir's own is not advanced (a caller decodes
        these in one pass, then admits batch by batch)."""
        m, start = self._capacity, self._seen
        n_fill = max(0, min(int(n), m - start))
        if n_fill == n:
            return np.arange(n_fill)
        positions = np.arange(start + n_fill, start + n, dtype=np.int64)
        draws = _copy(self._rng).integers(0, positions + 1)  # the draws admit() will make, per position
        return np.concatenate([np.arange(n_fill), n_fill + np.flatnonzero(draws < m)])

    def place(self, admission: Admission, rows: Mapping[str, np.ndarray],
              accepted: np.ndarray | None = None) -> None:
        """Store the admitted arrivals of :meth:`admit`: ``rows`` hold the accepted ones in order,
        ``accepted`` is a mask over ``admission.arrivals`` (default: all). A rejected admitted
        arrival empties its slot, exactly as in :meth:`add_batch`."""
        n_rows = self._check_rows(rows)
        self._store(admission, admitted_mask(admission, n_rows, accepted), rows, np.arange(n_rows))

    def add_batch(self, rows: Mapping[str, np.ndarray], accepted: np.ndarray | None = None) -> None:
        """Offer a batch of arrivals, in order.

        ``rows`` holds the preprocessed accepted records (the layout's columns). ``accepted`` is
        a boolean mask over all arrivals of the batch with one True per row; without it every
        arrival is a row. Rejected arrivals consume positions and empty the slots they win.
        """
        n_rows = self._check_rows(rows)
        if accepted is None:
            admission = self.admit(n_rows)
            good, src = np.ones(admission.arrivals.size, dtype=bool), admission.arrivals
        else:
            ok = np.asarray(accepted, dtype=bool)
            if ok.ndim != 1 or int(ok.sum()) != n_rows:
                raise ValueError(f"accepted mask has {int(ok.sum())} True entries for {n_rows} rows")
            admission = self.admit(ok.size)
            good = ok[admission.arrivals]
            src = (np.cumsum(ok) - 1)[admission.arrivals[good]]  # row index of each accepted arrival
        self._store(admission, good, rows, src)

    def _store(self, admission: Admission, good: np.ndarray, rows: Mapping[str, np.ndarray],
               src: np.ndarray) -> None:
        """Write ``rows[src]`` to the slots of the accepted admitted arrivals, empty the others."""
        if admission is not self._pending:
            raise RuntimeError("this admission is not the reservoir's pending one")
        slots = admission.slots
        self._valid[slots] = good
        if not good.all():
            for col in self._cols.values():
                col[slots[~good]] = 0  # the evicted record is gone, not kept behind a flag
        slots = slots[good]
        for name, col in self._cols.items():
            col[slots] = np.asarray(rows[name])[src]
        self._seen = admission.start + admission.n
        self._pending = None

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue exactly: filled rows, ``seen`` and the RNG state."""
        return {
            "capacity": self._capacity,
            "seen": self._seen,
            "columns": {name: col[: self.size].copy() for name, col in self._cols.items()},
            "valid": self._valid[: self.size].copy(),
            "rng": self._rng.bit_generator.state,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`get_state` (same layout and capacity)."""
        if int(state["capacity"]) != self._capacity:
            raise ValueError(
                f"reservoir state has capacity {state['capacity']}, this reservoir {self._capacity}"
            )
        seen = int(state["seen"])
        size = min(seen, self._capacity)
        cols = state["columns"]
        if set(cols) != set(self._layout):
            raise ValueError(f"reservoir state columns {sorted(cols)} do not match the layout")
        for name, (_, shape) in self._layout.items():
            arr = np.asarray(cols[name])
            if arr.shape != (size, *shape):
                raise ValueError(
                    f"reservoir state column {name!r} has shape {arr.shape}, expected {(size, *shape)}"
                )
        valid = np.asarray(state["valid"], dtype=bool)
        if valid.shape != (size,):
            raise ValueError(f"reservoir state valid mask has shape {valid.shape}, expected {(size,)}")
        for name, col in self._cols.items():
            col[:size] = cols[name]
            col[size:] = 0
        self._valid[:size] = valid
        self._valid[size:] = False
        self._rng.bit_generator.state = state["rng"]
        self._seen = seen
        self._pending = None
