"""Reservoir: uniform inclusion, value-independent membership (privacy rule 1 in docs/privacy.md),
bounded memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy import stats

from stream_vips.core.data.reservoir import Reservoir

LAYOUT = {"pos": (np.int64, ()), "x": (np.float64, (3,))}


def stream(start: int, n: int) -> dict[str, np.ndarray]:
    pos = np.arange(start, start + n, dtype=np.int64)
    return {"pos": pos, "x": np.stack([pos, -pos, 2 * pos], axis=1).astype(float)}


def feed(res: Reservoir, n: int, chunks: np.random.Generator | None = None) -> None:
    """Offer positions 0..n-1, split into batches whose sizes come from ``chunks``."""
    start = 0
    while start < n:
        k = n - start if chunks is None else int(min(n - start, chunks.integers(1, 12)))
        res.add_batch(stream(start, k))
        start += k


def test_fills_in_order_then_keeps_size():
    res = Reservoir(LAYOUT, capacity=5, rng=np.random.default_rng(1))
    res.add_batch(stream(0, 3))
    assert (res.size, res.seen, res.full) == (3, 3, False)
    np.testing.assert_array_equal(res.columns["pos"], [0, 1, 2])
    res.add_batch(stream(3, 20))
    assert (res.size, res.seen, res.full) == (5, 23, True)
    # rows stay consistent across columns
    np.testing.assert_array_equal(res.columns["x"][:, 0], res.columns["pos"])
    assert len(set(res.columns["pos"].tolist())) == 5


def test_batch_equals_sequential_algorithm_r_with_same_draws():
    """A batch applies replacements in arrival order: the last record hitting a slot wins."""
    m, n = 4, 60
    res = Reservoir(LAYOUT, capacity=m, rng=np.random.default_rng(7))
    res.add_batch(stream(0, n))
    draws = np.random.default_rng(7).integers(0, np.arange(m, n) + 1)
    slots = list(range(m))
    for p, j in zip(range(m, n), draws):
        if j < m:
            slots[j] = p
    assert np.sum(draws < m) > np.unique(draws[draws < m]).size  # collisions exercised
    np.testing.assert_array_equal(res.columns["pos"], slots)


def test_inclusion_uniform_over_positions_chi_square():
    """Over R seeds each position is kept with probability M/n.

    The inclusion vector of one run is a uniform M-subset, so the counts c have covariance
    R p (1-p) n/(n-1) (I - 11^T/n) with p = M/n; hence
    X = sum (c - Rp)^2 (n-1) / (R p (1-p) n) is approximately chi-square with n-1 degrees of
    freedom. We require its p-value above 0.001 (fixed seeds, so the outcome is deterministic).
    """
    m, n, runs = 8, 40, 3000
    counts = np.zeros(n)
    chunks = np.random.default_rng(12345)
    for seed in range(runs):
        res = Reservoir(LAYOUT, capacity=m, rng=np.random.default_rng(seed))
        feed(res, n, chunks)
        counts[res.columns["pos"]] += 1
    p = m / n
    x2 = np.sum((counts - runs * p) ** 2) * (n - 1) / (runs * p * (1 - p) * n)
    assert stats.chi2.sf(x2, n - 1) > 1e-3
    # and a biased reservoir (keep the first M) would fail the same test
    biased = np.zeros(n)
    biased[:m] = runs
    xb = np.sum((biased - runs * p) ** 2) * (n - 1) / (runs * p * (1 - p) * n)
    assert stats.chi2.sf(xb, n - 1) < 1e-3


def test_membership_identical_for_neighbouring_streams():
    """Replace-one neighbours (one record's value changed) keep the same positions."""
    n, m, changed = 500, 50, 123
    a = Reservoir(LAYOUT, capacity=m, rng=np.random.default_rng(99))
    b = Reservoir(LAYOUT, capacity=m, rng=np.random.default_rng(99))
    for start in range(0, n, 37):
        k = min(37, n - start)
        rows = stream(start, k)
        a.add_batch(rows)
        other = {"pos": rows["pos"], "x": rows["x"].copy()}
        hit = np.flatnonzero(rows["pos"] == changed)
        other["x"][hit] = [1e9, -1e9, 0.0]
        b.add_batch(other)
    np.testing.assert_array_equal(a.columns["pos"], b.columns["pos"])
    differs = np.any(a.columns["x"] != b.columns["x"], axis=1)
    assert np.array_equal(np.flatnonzero(differs), np.flatnonzero(a.columns["pos"] == changed))


def test_rejected_arrivals_keep_positions_and_empty_their_slots():
    """A record that turns malformed (value-dependent) still consumes its position (privacy rule 1)."""
    n, m, changed = 400, 40, 250
    for seed in range(100):  # the first seed whose reservoir keeps position `changed`
        a = Reservoir(LAYOUT, capacity=m, rng=np.random.default_rng(seed))
        b = Reservoir(LAYOUT, capacity=m, rng=np.random.default_rng(seed))
        for start in range(0, n, 64):
            k = min(64, n - start)
            rows = stream(start, k)
            a.add_batch(rows)
            ok = rows["pos"] != changed
            b.add_batch({name: col[ok] for name, col in rows.items()}, accepted=ok)
        if changed in a.columns["pos"]:
            break
    assert changed in a.columns["pos"] and b.seen == a.seen == n
    np.testing.assert_array_equal(b.valid, a.columns["pos"] != changed)
    np.testing.assert_array_equal(a.columns["pos"][b.valid], b.columns["pos"][b.valid])
    assert np.all(b.columns["x"][~b.valid] == 0)  # the evicted record is erased
    got = b.take(np.arange(m))  # the empty slot contributes nothing
    assert got["pos"].size == m - 1 and changed not in got["pos"]
    with pytest.raises(ValueError, match="accepted mask"):
        b.add_batch(stream(0, 2), accepted=np.array([True, False, False]))


def test_rejected_arrivals_while_filling():
    res = Reservoir(LAYOUT, capacity=5, rng=np.random.default_rng(0))
    ok = np.array([True, False, True])
    res.add_batch({name: col[[0, 2]] for name, col in stream(0, 3).items()}, accepted=ok)
    assert res.size == 3 and res.valid.tolist() == [True, False, True]
    np.testing.assert_array_equal(res.take(np.arange(3))["pos"], [0, 2])
    assert not res.full


def test_memory_bounded():
    res = Reservoir(LAYOUT, capacity=1000, rng=np.random.default_rng(3))
    fixed = res.nbytes
    assert fixed == 1000 * (8 + 3 * 8 + 1)  # columns + the valid mask
    res.add_batch(stream(0, 5000))
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    for start in range(5000, 205_000, 5000):  # 200k records, ~6.4 MB of rows offered
        res.add_batch(stream(start, 5000))
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert res.nbytes == fixed and res.size == 1000 and res.seen == 205_000
    assert current - base < 100_000


def test_state_round_trip_continues_identically():
    a = Reservoir(LAYOUT, capacity=20, rng=np.random.default_rng(5))
    a.add_batch(stream(0, 70))
    state = a.get_state()
    b = Reservoir(LAYOUT, capacity=20, rng=np.random.default_rng(999))
    b.set_state(state)
    for res in (a, b):
        res.add_batch(stream(70, 300))
    np.testing.assert_array_equal(a.columns["pos"], b.columns["pos"])
    assert a.seen == b.seen == 370


def test_take_and_validation():
    res = Reservoir(LAYOUT, capacity=4, rng=np.random.default_rng(0))
    res.add_batch(stream(0, 4))
    got = res.take(np.array([3, 1]))
    np.testing.assert_array_equal(got["pos"], [3, 1])
    got["x"][:] = 0  # a copy: the reservoir is unchanged
    assert res.columns["x"][3, 0] == 3.0
    with pytest.raises(IndexError):
        res.take(np.array([4]))
    with pytest.raises(ValueError, match="columns"):
        res.add_batch({"pos": np.arange(2)})
    with pytest.raises(ValueError, match="per-record shape"):
        res.add_batch({"pos": np.arange(2), "x": np.zeros((2, 4))})
    with pytest.raises(ValueError, match="capacity"):
        Reservoir(LAYOUT, capacity=0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError):
        res.columns["x"][0, 0] = 1.0  # read-only view


def test_candidates_are_exactly_the_arrivals_a_one_by_one_admission_keeps():
    """candidates(n) names every arrival whose own draw hits a slot, no more: what admitting the n
    arrivals one at a time would keep, drawn from a copy of the generator."""
    for seed in range(6):
        a = Reservoir(LAYOUT, capacity=5, rng=np.random.default_rng(seed))
        b = Reservoir(LAYOUT, capacity=5, rng=np.random.default_rng(seed))
        for res in (a, b):
            res.add_batch(stream(0, 3))  # two slots still fill, then Algorithm R
        candidates = a.candidates(40).tolist()
        kept = []
        for i in range(40):
            admission = b.admit(1)
            kept += [i] * admission.arrivals.size
            b.place(admission, {k: v[: admission.arrivals.size] for k, v in stream(3 + i, 1).items()})
        assert candidates == kept and 2 < len(kept) < 40


def test_masks_of_zeros_and_ones_are_read_as_booleans_and_checked_both_ways():
    """An accepted mask (or a restored valid mask) of 0/1 integers means what the booleans mean;
    a mask whose length or whose count of accepted entries does not match is refused."""
    ok = np.array([1, 0, 1, 1, 0, 1, 1, 1])
    a = Reservoir(LAYOUT, capacity=4, rng=np.random.default_rng(3))
    b = Reservoir(LAYOUT, capacity=4, rng=np.random.default_rng(3))
    rows = {k: v[ok.astype(bool)] for k, v in stream(0, 8).items()}
    a.add_batch(rows, accepted=ok.astype(bool))
    b.add_batch(rows, accepted=ok)
    assert a.valid.tolist() == b.valid.tolist() and a.columns["pos"].tolist() == b.columns["pos"].tolist()
    c = Reservoir(LAYOUT, capacity=4, rng=np.random.default_rng(3))
    admission = c.admit(8)
    mask = ok[admission.arrivals]
    c.place(admission, {k: v[admission.arrivals][mask.astype(bool)] for k, v in stream(0, 8).items()}, mask)
    assert c.valid.tolist() == a.valid.tolist() and c.columns["pos"].tolist() == a.columns["pos"].tolist()
    state = a.get_state()
    d = Reservoir(LAYOUT, capacity=4, rng=np.random.default_rng(0))
    d.set_state({**state, "valid": state["valid"].astype(int).tolist()})
    assert d.valid.tolist() == a.valid.tolist()
    e = Reservoir(LAYOUT, capacity=4, rng=np.random.default_rng(3))
    admission = e.admit(8)
    k = admission.arrivals.size
    rows_k = {name: v[:k] for name, v in stream(0, 8).items()}
    with pytest.raises(ValueError, match="accepted mask"):
        e.place(admission, rows_k, np.arange(k + 1) < k)  # k accepted, but one entry too many
    with pytest.raises(ValueError, match="accepted mask"):
        e.place(admission, rows_k, np.arange(k) > 0)  # the right length, one row too many


def test_capacity_and_indices_are_checked_at_their_boundaries():
    assert Reservoir(LAYOUT, capacity=1, rng=np.random.default_rng(0)).capacity == 1
    for capacity in (True, 2.5, -1):
        with pytest.raises(ValueError, match="capacity"):
            Reservoir(LAYOUT, capacity=capacity, rng=np.random.default_rng(0))
    res = Reservoir(LAYOUT, capacity=6, rng=np.random.default_rng(0))
    res.add_batch(stream(0, 4))  # four of six slots filled
    assert res.take([0, 3])["pos"].tolist() == [0, 3]
    for bad in ([4], [-1], [0, 4]):
        with pytest.raises(IndexError):
            res.take(bad)


@pytest.mark.parametrize("empty", [[], (), np.array([], dtype=float)])
def test_taking_no_slots_gives_empty_columns_of_the_layout(empty):
    """A sampler may draw no slot (a Poisson draw of zero): take() of an empty index list gives
    each column with zero rows and its own dtype and shape, not an indexing error."""
    res = Reservoir(LAYOUT, capacity=5, rng=np.random.default_rng(1))
    res.add_batch(stream(0, 5))
    out = res.take(empty)
    assert out["pos"].shape == (0,) and out["pos"].dtype == np.int64
    assert out["x"].shape == (0, 3) and out["x"].dtype == np.float64
