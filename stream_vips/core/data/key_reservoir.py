"""A reservoir of privacy units (keys): K key slots with at most L records each (privacy rule 12).

With ``privacy.unit: key`` the privacy unit is a key (a person), not a record. The reservoir then
holds K *key slots*; each slot belongs to one key at a time and keeps at most
L = ``max_records_per_key`` of that key's records. Memory is fixed at construction (K * L rows
plus K owner ids), and only the keys that currently own a slot are remembered (a dict of at most
K entries): nothing grows with the number of distinct keys the stream has seen.

Every decision is taken from the key sequence, arrival positions and this reservoir's own random
generator, never from record values or their validity. Two draws are made per arrival at
0-based position p, whatever its key or value: ``j ~ U{0..p}`` and ``u ~ U[0, 1)``, each from its
own generator (spawned from the reservoir's), so the result does not depend on how the stream is
cut into batches.

* **Fill.** Until all K slots have an owner, a key that owns no slot takes the next free one at
  its arrival.
* **Key replacement (Algorithm R's rule over arrivals).** Once full, an arrival whose key owns no
  slot takes slot ``j`` when ``j < K`` (probability K / (p + 1)); the slot's former owner and its
  records leave. Arrivals of a key that owns a slot never move keys.
* **Records within a slot (Algorithm R per key).** The c-th arrival of the slot's owner since it
  took the slot fills sub-slot c - 1 while c <= L, and otherwise replaces sub-slot
  ``floor(u * c)`` when that is < L. A key holding L records is thus never given more: its new
  records only replace its own ones.
* A rejected arrival goes through all of the above and leaves its sub-slot empty (a null record
  contributing zero); an arrival without a key (``has_key`` False) takes no slot and keeps its
  position and its draws.

Neighbours under key-level adjacency (same key sequence, positions and times; the values of all
records of one key k replaced) therefore see the same owners, tenures and sub-slot positions in
every slot at every time: only the contents of the (at most one) slot that k owns differ.

The work per batch is vectorized: draws, fill and the per-key Algorithm R are numpy over the
batch; only key replacements are visited one by one (their expected number up to position N is
about K ln(N / K) over the whole stream, not per record), since each depends on the owners left by
the previous one.

>>> import numpy as np
>>> res = KeyReservoir({"x": (np.float64, ())}, capacity=2, max_records_per_key=2,
...                    rng=np.random.default_rng(0))
>>> res.add_batch({"x": np.arange(5.0)}, keys=np.array([7, 7, 7, 9, 9]))
>>> res.full, res.records_held, res.held_per_slot().tolist()
(True, 4, [2, 2])
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from stream_vips.core.data.reservoir import Admission, Layout, admitted_mask

#: Rejection reason of an arrival whose privacy key cannot be read (no Kafka key, no field).
MISSING_KEY = "missing_key"

_MASK64 = (1 << 64) - 1


def _mix64(v: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on uint64 that spreads integer keys over all bits."""
    z = v.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


#: Version of the key -> id mapping; reservoir states record it, and a state written under
#: another mapping is refused (its owners' ids would not match the same keys' ids now).
KEY_ID_SCHEME = 2
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)")


def key_ids(keys: Iterable[object] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """64-bit ids of privacy keys and a mask of arrivals that have one.

    One key, one id, whatever its spelling reached us in: ``bytes`` that are UTF-8 are read as
    text, text is put in Unicode normal form NFC, and text that is a canonical decimal integer
    (``"42"``, ``"-7"``; not ``"042"`` or ``"+42"``) is that integer. So the Kafka key ``b"42"``,
    the JSON field ``"42"`` and ``42`` are one key, and so are ``"José"`` in its composed and
    decomposed forms; a person whose key changed type or normal form would otherwise count as
    two units and move a release by twice the bound. Integers (Python or numpy) are mixed with
    splitmix64, other text hashed as its UTF-8 bytes and other bytes as they are (BLAKE2b, 8
    bytes). ``None``, booleans, floats and containers have no key. Ids are deterministic (a
    restart maps keys the same way). Two keys with one id are treated as one unit: privacy
    holds for both (the unit's clipped sum still moves by at most the bound), only the cap is
    shared; case, spaces and other spellings of one person are the producer's to make canonical.

    >>> ids, has = key_ids([42, "42", b"42", "042", None])
    >>> bool(ids[0] == ids[1] == ids[2] != ids[3]), has.tolist()
    (True, [True, True, True, True, False])
    """
    if isinstance(keys, np.ndarray) and keys.dtype.kind in "iu":
        return _mix64(keys.astype(np.int64).view(np.uint64)), np.ones(keys.shape[0], dtype=bool)
    items = list(keys)
    ids = np.zeros(len(items), dtype=np.uint64)
    has = np.zeros(len(items), dtype=bool)
    ints: list[tuple[int, int]] = []
    for i, k in enumerate(items):
        if isinstance(k, (bytes, bytearray, memoryview)):
            try:
                k = bytes(k).decode("utf-8")
            except UnicodeDecodeError:
                ids[i] = int.from_bytes(hashlib.blake2b(bytes(k), digest_size=8).digest(), "little")
                has[i] = True
                continue
        if isinstance(k, str):
            k = unicodedata.normalize("NFC", k)
            if _DECIMAL.fullmatch(k) is None:
                ids[i] = int.from_bytes(hashlib.blake2b(k.encode("utf-8"), digest_size=8).digest(), "little")
                has[i] = True
                continue
            k = int(k)
        if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
            ints.append((i, int(k)))
    if ints:
        idx = np.array([i for i, _ in ints], dtype=np.intp)
        ids[idx] = _mix64(np.array([k & _MASK64 for _, k in ints], dtype=np.uint64))
        has[idx] = True
    return ids, has


class KeyReservoir:
    """K key slots of L record sub-slots each (module docstring); the unit of sampling is a slot.

    :attr:`capacity` is K (the public number of privacy units a batch is drawn from),
    :attr:`full` says every slot has an owner; :meth:`take_groups` returns the records of the
    chosen slots with a group id per record (the slot's position in the request).
    """

    unit = "key"

    def __init__(self, layout: Layout, capacity: int, max_records_per_key: int, rng: np.random.Generator) -> None:
        for name, value in (("capacity", capacity), ("max_records_per_key", max_records_per_key)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"key reservoir {name} must be a positive integer, got {value!r}")
        if not layout:
            raise ValueError("reservoir layout must name at least one column")
        if not isinstance(rng, np.random.Generator):
            raise TypeError("reservoir rng must be a numpy.random.Generator")
        self._capacity, self._per_key = int(capacity), int(max_records_per_key)
        self._layout = {name: (np.dtype(dt), tuple(shape)) for name, (dt, shape) in layout.items()}
        K, L = self._capacity, self._per_key
        self._cols = {name: np.zeros((K, L, *shape), dtype=dt) for name, (dt, shape) in self._layout.items()}
        self._valid = np.zeros((K, L), dtype=bool)  # a record that passed validation
        self._occupied = np.zeros((K, L), dtype=bool)  # written by an arrival (valid or not)
        self._owner = np.zeros(K, dtype=np.uint64)
        self._count = np.zeros(K, dtype=np.int64)  # arrivals of the owner since it took the slot
        self._filled = 0
        self._slot_of: dict[int, int] = {}  # owner id -> slot, for the <= K current owners only
        self._rng, self._sub_rng = rng.spawn(2)  # key replacement draws; record draws inside a slot
        self._seen = 0
        self._pending: Admission | None = None

    # -- public shape ---------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """K, the public number of key slots (privacy units a batch is drawn from)."""
        return self._capacity

    @property
    def max_records_per_key(self) -> int:
        """L, the most records one key can hold."""
        return self._per_key

    @property
    def seen(self) -> int:
        """Arrival positions consumed so far."""
        return self._seen

    @property
    def size(self) -> int:
        """Key slots that have an owner."""
        return self._filled

    @property
    def full(self) -> bool:
        """Every key slot has an owner (privacy rule 5: no release before)."""
        return self._filled >= self._capacity

    @property
    def records_held(self) -> int:
        """Sub-slots written by an arrival (valid or not)."""
        return int(self._occupied.sum())

    @property
    def valid(self) -> np.ndarray:
        """Validity of every held arrival (flat over occupied sub-slots); its mean is the fraction
        of held arrivals that were accepted (public, privacy rule 1)."""
        return self._valid[self._occupied]

    @property
    def layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return dict(self._layout)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (constant after construction; the owner dict adds <= K entries)."""
        arrays = [*self._cols.values(), self._valid, self._occupied, self._owner, self._count]
        return sum(a.nbytes for a in arrays)

    @property
    def tracked_keys(self) -> int:
        """Keys remembered now: the owners of slots, never more than K."""
        return len(self._slot_of)

    def owners(self) -> np.ndarray:
        """Ids of the owners of the filled slots, by slot."""
        return self._owner[: self._filled].copy()

    def held_per_slot(self) -> np.ndarray:
        """Number of held arrivals per filled slot (each <= L)."""
        return self._occupied[: self._filled].sum(axis=1)

    # -- reads ----------------------------------------------------------------------------------

    def take_groups(self, slots: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
        """Valid records of key slots ``slots`` as rows, their group (index into ``slots``) and
        the number of groups. A slot with no valid record is a group contributing zero."""
        idx = np.asarray(slots, dtype=np.intp)
        if idx.ndim != 1:
            raise ValueError("key slot indices must be one-dimensional")
        if idx.size and (idx.min() < 0 or idx.max() >= self._filled):
            raise IndexError(f"key slot index out of range [0, {self._filled})")
        mask = self._valid[idx]  # (n_groups, L)
        groups, sub = np.nonzero(mask)
        rows = {name: col[idx[groups], sub] for name, col in self._cols.items()}
        return rows, groups.astype(np.intp), int(idx.size)

    # -- writes ---------------------------------------------------------------------------------

    def _check_rows(self, rows: Mapping[str, np.ndarray]) -> int:
        if set(rows) != set(self._layout):
            raise ValueError(f"reservoir rows have columns {sorted(rows)}, layout expects {sorted(self._layout)}")
        n = None
        for name, (_, shape) in self._layout.items():
            arr = np.asarray(rows[name])
            if arr.shape[1:] != shape:
                raise ValueError(f"reservoir column {name!r}: per-record shape {arr.shape[1:]}, expected {shape}")
            if n is not None and arr.shape[0] != n:
                raise ValueError("reservoir columns of one batch must have the same number of rows")
            n = arr.shape[0]
        return int(n or 0)

    def add_batch(self, rows: Mapping[str, np.ndarray], keys: np.ndarray, accepted: np.ndarray | None = None,
                  has_key: np.ndarray | None = None) -> None:
        """Offer a batch of arrivals, in order.

        ``keys``: one id per arrival (:func:`key_ids`; an integer array is used as ids after
        mixing). ``accepted``: mask over all arrivals, one True per row of ``rows`` (default: all).
        ``has_key``: arrivals with a key (default: all); the others keep their positions only.
        """
        n_rows = self._check_rows(rows)
        n = np.asarray(keys).shape[0]
        ok = np.ones(n, dtype=bool) if accepted is None else np.asarray(accepted, dtype=bool)
        if ok.shape != (n,) or int(ok.sum()) != n_rows:
            raise ValueError(f"accepted mask has {int(ok.sum())} True entries of {ok.size} for {n_rows} rows "
                             f"and {n} keys")
        admission = self.admit(keys, has_key)
        good = ok[admission.arrivals]
        self._store(admission, good, rows, (np.cumsum(ok) - 1)[admission.arrivals[good]])

    def place(self, admission: Admission, rows: Mapping[str, np.ndarray],
              accepted: np.ndarray | None = None) -> None:
        """Store the arrivals of :meth:`admit` (as :meth:`Reservoir.place`): ``rows`` hold the
        accepted ones in order, ``accepted`` is a mask over ``admission.arrivals``."""
        n_rows = self._check_rows(rows)
        self._store(admission, admitted_mask(admission, n_rows, accepted), rows, np.arange(n_rows))

    def candidates(self, n: int) -> None:
        """``None``: which sub-slot an arrival takes depends on the owners earlier arrivals leave,
        so admission is decided batch by batch (:meth:`admit`)."""
        return None

    def admit(self, keys: np.ndarray, has_key: np.ndarray | None = None) -> Admission:
        """Decide slot owners, tenures and sub-slots for a batch of arrivals from their keys,
        positions and the draws only (module docstring), before any record is read: the
        arrivals that hold a sub-slot after the batch and their cells (``slot * L + sub``).
        :meth:`place` (or :meth:`add_batch`, which calls both) writes them."""
        if self._pending is not None:
            raise RuntimeError("an admission is pending: place() it before admitting more arrivals")
        keys = np.asarray(keys)
        n = keys.shape[0]
        if keys.ndim != 1:
            raise ValueError("keys must be one id per arrival")
        if keys.dtype != np.uint64:
            keys, _ = key_ids(keys)
        present = np.ones(n, dtype=bool) if has_key is None else np.asarray(has_key, dtype=bool)
        if present.shape != (n,):
            raise ValueError("has_key must be one flag per arrival")
        none = np.zeros(0, dtype=np.int64)
        if n == 0:
            self._pending = Admission(self._seen, 0, none, none, renewed=none)
            return self._pending
        K, L = self._capacity, self._per_key
        positions = self._seen + np.arange(n, dtype=np.int64)
        draws = self._rng.integers(0, positions + 1)  # key replacement: j ~ U{0..p}
        u = self._sub_rng.random(n)  # record replacement inside a slot
        keys_list = keys.tolist()  # Python ints for the owner dict (only events look them up)

        # Slot of each arrival's key at the start of the batch (a static map until the first event).
        slot = np.full(n, -1, dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        uniq, first_sorted = np.unique(sorted_keys, return_index=True)
        bounds = np.append(first_sorted, n)
        owners_now = self._owner[: self._filled]
        if self._filled:
            o_sort = np.argsort(owners_now)
            hit = np.searchsorted(owners_now[o_sort], uniq)
            hit = np.minimum(hit, self._filled - 1)
            is_owner = owners_now[o_sort][hit] == uniq
            start_slot = np.where(is_owner, o_sort[hit], -1)
        else:
            start_slot = np.full(uniq.size, -1, dtype=np.int64)
        group_of = np.repeat(np.arange(uniq.size), np.diff(bounds))  # in sorted order
        slot[order] = start_slot[group_of]
        slot[~present] = -1
        events: list[tuple[int, int]] = []  # (arrival index, slot) where an owner took a slot

        def arrivals_of(key: int, after: int) -> np.ndarray:
            kk = np.uint64(key)
            lo, hi = np.searchsorted(sorted_keys, kk, "left"), np.searchsorted(sorted_keys, kk, "right")
            idx = order[lo:hi]  # increasing arrival index (stable sort)
            idx = idx[np.searchsorted(idx, after):]
            return idx[present[idx]]

        # Fill: keys without a slot take free slots at their first keyed arrival, in order.
        full_from = 0
        if self._filled < K:
            # first keyed arrival of each distinct id (n: none; arrivals without a key have no id)
            first_keyed = np.minimum.reduceat(np.where(present[order], order, n), first_sorted)
            new = np.flatnonzero((start_slot < 0) & (first_keyed < n))
            new = new[np.argsort(first_keyed[new], kind="stable")][: K - self._filled]
            for g in new:  # at most K over the whole stream
                s, t = self._filled, int(first_keyed[g])
                key = int(uniq[g])
                self._owner[s], self._count[s] = uniq[g], 0
                self._slot_of[key] = s
                self._filled += 1
                idx = order[bounds[g]:bounds[g + 1]]
                slot[idx[present[idx]]] = s
                events.append((t, s))
                full_from = t + 1
            if self._filled < K:
                full_from = n  # no replacement before the reservoir is full
        # Key replacements, in arrival order: only arrivals with j < K are candidates.
        cand = np.flatnonzero((draws < K) & present)
        cand = cand[cand >= full_from]
        for i in cand.tolist():
            key = keys_list[i]
            if key in self._slot_of:
                continue
            j = int(draws[i])
            old = int(self._owner[j])
            del self._slot_of[old]
            slot[arrivals_of(old, i + 1)] = -1
            self._owner[j] = keys[i]
            self._slot_of[key] = j
            slot[arrivals_of(key, i)] = j
            events.append((i, j))

        # Per-key Algorithm R inside each slot, for the last tenure of each slot in this batch.
        live = np.flatnonzero(slot >= 0)
        if live.size == 0:
            self._pending = Admission(self._seen, n, none, none, renewed=none)
            return self._pending
        s_live = slot[live]
        last_event = np.full(K, -1, dtype=np.int64)
        for t, s in events:  # events are in arrival order per slot; keep the last one
            last_event[s] = max(last_event[s], t)
        keep = live >= last_event[s_live]
        live, s_live = live[keep], s_live[keep]
        renewed = np.flatnonzero(last_event >= 0)
        self._count[renewed] = 0
        by_slot = np.argsort(s_live, kind="stable")
        live, s_live = live[by_slot], s_live[by_slot]
        starts = np.searchsorted(s_live, s_live, "left")
        c = self._count[s_live] + (np.arange(live.size) - starts) + 1  # arrival number within tenure
        sub = np.where(c <= L, c - 1, np.floor(u[live] * c).astype(np.int64))
        np.add.at(self._count, s_live, 1)
        hit = sub < L
        live, s_live, sub = live[hit], s_live[hit], sub[hit]
        # The last arrival per (slot, sub-slot) wins, as if inserted one by one.
        cell = s_live * L + sub
        order_t = np.argsort(live, kind="stable")
        live, cell = live[order_t], cell[order_t]
        _, first_rev = np.unique(cell[::-1], return_index=True)
        last = np.sort(cell.size - 1 - first_rev)  # in arrival order
        self._pending = Admission(self._seen, n, live[last], cell[last], renewed=renewed)
        return self._pending

    def _store(self, admission: Admission, good: np.ndarray, rows: Mapping[str, np.ndarray],
               src: np.ndarray) -> None:
        """Restart the renewed slots, then write ``rows[src]`` to the cells of the accepted
        admitted arrivals and empty the others' cells."""
        if admission is not self._pending:
            raise RuntimeError("this admission is not the reservoir's pending one")
        renewed = admission.renewed
        self._valid[renewed] = False
        self._occupied[renewed] = False
        for col in self._cols.values():
            col[renewed] = 0
        s_live, sub = np.divmod(admission.slots, self._per_key)
        self._occupied[s_live, sub] = True
        self._valid[s_live, sub] = good
        for name, col in self._cols.items():
            col[s_live[~good], sub[~good]] = 0
            col[s_live[good], sub[good]] = np.asarray(rows[name])[src]
        self._seen = admission.start + admission.n
        self._pending = None

    # -- checkpoints ----------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue exactly: slots, owners, counts, ``seen`` and the RNG."""
        f = self._filled
        return {
            "unit": "key",
            "key_ids": KEY_ID_SCHEME,
            "capacity": self._capacity,
            "max_records_per_key": self._per_key,
            "seen": self._seen,
            "filled": f,
            "owners": self._owner[:f].copy(),
            "counts": self._count[:f].copy(),
            "columns": {name: col[:f].copy() for name, col in self._cols.items()},
            "valid": self._valid[:f].copy(),
            "occupied": self._occupied[:f].copy(),
            "rng": self._rng.bit_generator.state,
            "sub_rng": self._sub_rng.bit_generator.state,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a state from :meth:`get_state` (same layout, K and L)."""
        if state.get("unit") != "key":
            raise ValueError("reservoir state is for privacy.unit record, this reservoir is for unit key")
        if state.get("key_ids") != KEY_ID_SCHEME:
            raise ValueError(
                f"reservoir state maps keys to ids under scheme {state.get('key_ids', 1)}, this version under "
                f"{KEY_ID_SCHEME} (keys spelled as decimal text or in decomposed Unicode now share the id of their "
                "canonical form): a restored slot could share its person with a new one; remove the checkpoint "
                "(the ledger keeps the spent budget)")
        if int(state["capacity"]) != self._capacity or int(state["max_records_per_key"]) != self._per_key:
            raise ValueError(f"reservoir state has {state['capacity']} key slots of {state['max_records_per_key']}, "
                             f"this reservoir {self._capacity} of {self._per_key}")
        f = int(state["filled"])
        owners = np.asarray(state["owners"], dtype=np.uint64)
        if owners.shape != (f,) or len(set(owners.tolist())) != f:
            raise ValueError("reservoir state owners must be one distinct id per filled slot")
        cols = state["columns"]
        if set(cols) != set(self._layout):
            raise ValueError(f"reservoir state columns {sorted(cols)} do not match the layout")
        for name, (_, shape) in self._layout.items():
            if np.asarray(cols[name]).shape != (f, self._per_key, *shape):
                raise ValueError(f"reservoir state column {name!r} has the wrong shape")
        for name, col in self._cols.items():
            col[:f], col[f:] = cols[name], 0
        for arr, key in ((self._valid, "valid"), (self._occupied, "occupied")):
            arr[:f], arr[f:] = np.asarray(state[key], dtype=bool), False
        self._owner[:f], self._owner[f:] = owners, 0
        self._count[:f], self._count[f:] = np.asarray(state["counts"], dtype=np.int64), 0
        self._filled, self._seen = f, int(state["seen"])
        self._slot_of = {int(k): s for s, k in enumerate(owners.tolist())}
        self._rng.bit_generator.state = state["rng"]
        self._sub_rng.bit_generator.state = state["sub_rng"]
        self._pending = None
