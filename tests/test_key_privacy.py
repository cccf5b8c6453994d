"""Privacy per key (privacy rule 12): the key reservoir, per-key clipping, reports, audit."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from stream_vips import PrivateLearner, messages
from stream_vips.audit.release import AUDIT_BUDGET, claimed_epsilon, flatten
from stream_vips.audit.stats import audit_samples
from stream_vips.config import ConfigError
from stream_vips.core.data.key_reservoir import MISSING_KEY, KeyReservoir, key_ids
from stream_vips.core.data.sampling import make_sampler
from stream_vips.core.engine import PrivateEngine, allocation_weights
from stream_vips.models.base import group_gram_norms, group_sum
from stream_vips.models.linreg import LinearRegression
from stream_vips.models.logistic import BayesianLogisticRegression
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.ledger import MemoryLedger
from stream_vips.service.build import config_from_dict

LAYOUT = {"x": (np.float64, ())}


def _reference(batches, K, L, seed):
    """One-by-one statement of the key reservoir's rules (module docstring), same draws per batch."""
    rng, sub_rng = np.random.default_rng(seed).spawn(2)
    owner, count, cells, filled, seen = [None] * K, [0] * K, [[None] * L for _ in range(K)], 0, 0
    for keys, vals in batches:
        n = len(keys)
        draws, u = rng.integers(0, seen + np.arange(n) + 1), sub_rng.random(n)
        for i, (k, v) in enumerate(zip(keys, vals)):
            if k is None:
                continue
            if k in owner[:filled]:
                s = owner.index(k)
            elif filled < K:
                s, filled = filled, filled + 1
                owner[s], count[s], cells[s] = k, 0, [None] * L
            elif draws[i] < K:
                s = int(draws[i])
                owner[s], count[s], cells[s] = k, 0, [None] * L
            else:
                continue
            count[s] += 1
            sub = count[s] - 1 if count[s] <= L else int(np.floor(u[i] * count[s]))
            if sub < L:
                cells[s][sub] = "rejected" if v is None else v
        seen += n
    return owner[:filled], cells[:filled]


def _offer(res, keys, vals):
    ids, has = key_ids(keys)
    ok = np.array([v is not None for v in vals], dtype=bool)
    res.add_batch({"x": np.array([v for v in vals if v is not None], dtype=float)}, ids, accepted=ok, has_key=has)


def test_vectorized_batches_follow_the_one_by_one_rules():
    for trial in range(150):
        r = np.random.default_rng(trial)
        K, L, n_keys = int(r.integers(1, 6)), int(r.integers(1, 4)), int(r.integers(1, 15))
        batches = []
        for _ in range(int(r.integers(1, 6))):
            n = int(r.integers(0, 30))
            keys = [None if r.random() < 0.1 else int(r.integers(0, n_keys)) for _ in range(n)]
            vals = [float(v) if r.random() > 0.2 else None for v in r.normal(size=n)]
            batches.append((keys, vals))
        res = KeyReservoir(LAYOUT, K, L, np.random.default_rng(99))
        for keys, vals in batches:
            _offer(res, keys, vals)
        owner, cells = _reference(batches, K, L, 99)
        assert res.owners().tolist() == [int(key_ids([k])[0][0]) for k in owner], trial
        for s, row in enumerate(cells):
            for j, cell in enumerate(row):
                if cell is None:
                    assert not res._occupied[s, j], (trial, s, j)
                elif cell == "rejected":
                    assert res._occupied[s, j] and not res._valid[s, j], (trial, s, j)
                else:
                    assert res._valid[s, j] and res._cols["x"][s, j] == cell, (trial, s, j)


def _stream(seed, n=4000, n_keys=300):
    r = np.random.default_rng(seed)
    keys = np.minimum((r.pareto(1.1, n) * 3).astype(np.int64), n_keys)  # heavy-tailed counts per key
    return keys, r.normal(size=n)


def test_neighbours_keep_every_other_keys_membership_and_contents():
    """Replacing all records of one key (any values, some now invalid) changes nothing else."""
    keys, vals = _stream(1)
    heavy = int(np.bincount(keys).argmax())
    other = vals.copy()
    other[keys == heavy] = 1e6 + np.arange((keys == heavy).sum())
    ok_b = np.ones(keys.size, dtype=bool)
    ok_b[np.flatnonzero(keys == heavy)[::3]] = False  # the neighbour's records may also turn invalid
    a = KeyReservoir(LAYOUT, 64, 3, np.random.default_rng(5))
    b = KeyReservoir(LAYOUT, 64, 3, np.random.default_rng(5))
    for lo in range(0, keys.size, 700):  # several batches, also of different sizes on each side
        sl = slice(lo, lo + 700)
        a.add_batch({"x": vals[sl]}, keys[sl])
    for lo, hi in [(0, 1), (1, 2500), (2500, keys.size)]:
        b.add_batch({"x": other[lo:hi][ok_b[lo:hi]]}, keys[lo:hi], accepted=ok_b[lo:hi])
    assert np.array_equal(a.owners(), b.owners())
    assert np.array_equal(a._occupied, b._occupied) and np.array_equal(a._count, b._count)
    heavy_id = key_ids(np.array([heavy]))[0][0]
    others = a.owners() != heavy_id
    assert others.sum() >= 63
    assert np.array_equal(a._cols["x"][:64][others], b._cols["x"][:64][others])
    assert np.array_equal(a._valid[:64][others], b._valid[:64][others])


def _heavy_stream(model, record_of, heavy_value, n_heavy=10_000, n_light=400, seed=0):
    """10,000 records of key -1 (value ``heavy_value``) spread among light keys' records."""
    r = np.random.default_rng(seed)
    keys = np.concatenate([np.full(n_heavy, -1), r.integers(0, 200, n_light)])
    order = r.permutation(keys.size)
    keys = keys[order]
    recs = [record_of(r) for _ in range(n_light)]
    values = [heavy_value] * n_heavy + recs
    values = [values[i] for i in order]
    parsed = model.parse_batch(values)
    assert len(parsed.accepted) == keys.size
    return parsed.rows, keys


FAMILIES = [
    (lambda: LinearRegression(dim=2, dataset_size=64, noise="gamma", y_bound=2.0),
     lambda r: {"x": r.uniform(-1, 1, 2).tolist(), "y": float(r.normal())},
     {"x": [1.0, 0.0], "y": 2.0}, {"x": [0.0, 1.0], "y": -2.0}),
    (lambda: BayesianLogisticRegression(dim=2, dataset_size=64),
     lambda r: {"x": r.uniform(-1, 1, 2).tolist(), "y": int(r.integers(0, 2))},
     {"x": [1.0, 0.0], "y": 1}, {"x": [-1.0, 0.0], "y": 0}),
]


@pytest.mark.parametrize("family", range(len(FAMILIES)))
def test_one_key_moves_the_batch_sum_by_at_most_the_bound(family):
    make, record_of, value_a, value_b = FAMILIES[family]
    model = make()
    L = 4
    sums, held = [], []
    for value in (value_a, value_b):
        rows, keys = _heavy_stream(model, record_of, value)
        res = KeyReservoir(model.row_layout(), 64, L, np.random.default_rng(3))
        res.add_batch(rows, keys)
        assert res.full
        heavy_slot = np.flatnonzero(res.owners() == key_ids(np.array([-1]))[0][0])
        held.append(res.held_per_slot()[heavy_slot])
        sums.append(model.group_clipped_sum(*res.take_groups(np.arange(64))))
    assert held[0].tolist() == held[1].tolist() and all(h <= L for h in held[0])
    weights = allocation_weights(model.blocks(), model.default_block_weights())
    whitened = np.sqrt(sum((weights[b.name] / b.bound) ** 2 * np.sum((sums[0][b.name] - sums[1][b.name]) ** 2)
                           for b in model.blocks()))
    assert whitened <= model.group_diameter(weights) * (1 + 1e-9)
    # whatever it sends: one key's 10,000 records in one group stay within every block's bound
    rows, keys = _heavy_stream(model, record_of, value_a, n_light=0)
    one = model.group_clipped_sum(rows, np.zeros(keys.size, dtype=np.intp), 1)
    for block in model.blocks():
        assert np.linalg.norm(one[block.name]) <= block.bound * (1 + 1e-9)


@pytest.mark.parametrize("family", range(len(FAMILIES)))
def test_group_sums_agree_with_per_record_sums_and_a_plain_loop(family):
    make, record_of, _, _ = FAMILIES[family]
    model = make()
    r = np.random.default_rng(2)
    rows = model.parse_batch([record_of(r) for _ in range(60)]).rows
    single = model.group_clipped_sum(rows, np.arange(60), 60)
    plain = model.clipped_sum(rows)
    for name in plain:  # records are clipped already: singleton groups are never scaled
        assert np.allclose(single[name], plain[name], rtol=1e-12, atol=1e-12)
    groups = r.integers(0, 7, 60)
    got = model.group_clipped_sum(rows, groups, 8)  # group 7 is empty
    want = {name: 0.0 for name in plain}
    for g in range(8):
        part = model.clipped_sum({k: v[groups == g] for k, v in rows.items()})
        scale = min([1.0] + [b.bound / np.linalg.norm(part[b.name]) for b in model.blocks()
                             if np.linalg.norm(part[b.name]) > b.bound])
        for name in want:
            want[name] = want[name] + scale * part[name]
    for name in plain:
        assert np.allclose(got[name], want[name], rtol=1e-12, atol=1e-12)


def test_group_helpers():
    W = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    g = np.array([0, 0, 2])
    assert group_sum(W, g, 3).tolist() == [[1.0, 2.0], [0.0, 0.0], [3.0, 4.0]]
    want = [np.linalg.norm(np.outer(W[0], W[0]) + np.outer(W[1], W[1])), 0.0, 25.0]
    assert np.allclose(group_gram_norms(W, g, 3), want)


def test_memory_stays_flat_over_a_million_distinct_keys():
    K, L, batch = 1000, 2, 100_000
    res = KeyReservoir({"x": (np.float64, (3,))}, K, L, np.random.default_rng(0))
    nbytes = res.nbytes
    rows = {"x": np.ones((batch, 3))}
    tracemalloc.start()
    try:
        held = {}
        for b in range(10):  # 1e6 arrivals, every one a new key
            res.add_batch(rows, np.arange(b * batch, (b + 1) * batch))
            assert res.tracked_keys <= K
            if b in (0, 9):
                gc.collect()
                held[b] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert res.nbytes == nbytes and res.seen == 10 * batch and res.full
    # The only structure that could grow is the owner dict, capped at K entries. Remembering the
    # 9e5 further keys would take at least 9e5 dict entries of >= 64 bytes (57 MB); the traced
    # growth must stay under 1% of that (other allocations of the process, e.g. caches warmed by
    # earlier tests, move the traced total by tens of kB).
    assert held[9] - held[0] < 0.01 * 9 * batch * 64


def test_checkpoint_continues_exactly():
    keys, vals = _stream(4)
    a = KeyReservoir(LAYOUT, 32, 2, np.random.default_rng(1))
    a.add_batch({"x": vals[:2000]}, keys[:2000])
    b = KeyReservoir(LAYOUT, 32, 2, np.random.default_rng(7))
    b.set_state(a.get_state())
    for res in (a, b):
        res.add_batch({"x": vals[2000:]}, keys[2000:])
    assert np.array_equal(a.owners(), b.owners()) and np.array_equal(a._cols["x"], b._cols["x"])
    with pytest.raises(ValueError, match="unit record"):
        b.set_state({**a.get_state(), "unit": "record"})


def _key_engine(model, rows, keys, K, L, z, seed):
    res = KeyReservoir(model.row_layout(), K, L, np.random.default_rng(seed))
    res.add_batch(rows, keys)
    sampler = make_sampler("fixed", K, K)
    monitor = BudgetMonitor(AUDIT_BUDGET, 1e-3, make_accountant("strong", "fixed"), MemoryLedger())
    engine = PrivateEngine(model, res, sampler, monitor, z, np.random.default_rng(seed + 1), tau0=1.0, kappa=1.0,
                           accountant_name="strong", seeded=True, unit="key")
    captured = []
    model.update = lambda mean, rho: captured.append(flatten(mean, tuple(model.blocks())))
    return engine, captured


def test_audit_of_one_release_replacing_a_heavy_key_stays_below_the_claim():
    """Neighbours: key -1 sends 10,000 records of one value or of another; other keys agree."""
    z, K, L, delta = 3.0, 4, 4, 1e-3
    light = [{"x": [0.3], "y": 0.5}, {"x": [-0.2], "y": 0.1}, {"x": [0.5], "y": -0.4}]
    keys = np.concatenate([np.arange(3), np.full(10_000, -1)])
    sides = []
    for y in (1.0, -1.0):
        model = LinearRegression(dim=1, dataset_size=K)
        rows = model.parse_batch(light + [{"x": [1.0], "y": y}] * 10_000).rows
        engine, captured = _key_engine(model, rows, keys, K, L, z, seed=11)
        for _ in range(9000):
            engine.step()
        sides.append(np.array(captured))
        event = engine.event()
    claimed = claimed_epsilon(event, delta)
    a, b = sides
    result = audit_samples(a[:3000], b[:3000], a[3000:], b[3000:], delta, claimed)
    assert event.diameter == 2.0 and event.sampling_rate == 1.0
    # the heavy key holds L = 4 records of xy = +-1 each: unclipped, it would move xy by 8, i.e.
    # 4x the bound, and the audit would find far more than the claim; clipped, it moves it by 2.
    assert result.epsilon_lower_bound > 0.3 * claimed  # the test has power
    assert not result.violated, result.to_dict()


def test_learner_key_unit_report_and_key_field():
    base = dict(dim=2, epsilon=1.0, reservoir=50, batch_size=10, every_records=100, planned_steps=5, seed=3,
                unit="key", max_records_per_key=2, key_field="user")
    learner = PrivateLearner("logistic", **base)
    r = np.random.default_rng(0)
    recs = [{"x": r.uniform(-1, 1, 2).tolist(), "y": int(r.integers(0, 2)), "user": f"u{int(k)}"}
            for k in r.integers(0, 80, 600)]
    recs[5] = {"x": [0.1, 0.2], "y": 1}  # no key: rejected, keeps its position
    batch = learner.feed(recs)
    assert (5, MISSING_KEY, "no privacy key") in batch.rejected and not batch.ok[5]
    assert learner.reservoir.seen == 600 and learner.steps_taken == 5
    assert learner.reservoir.held_per_slot().max() <= 2
    report = learner.privacy_report()
    assert report["unit"] == "key" and report["max_records_per_key"] == 2
    assert report["q"] == pytest.approx(10 / 50) and report["diameter"] == pytest.approx(np.sqrt(3.6))
    messages.validate_message(learner.message())
    record = PrivateLearner("logistic", dim=2, reservoir=50, batch_size=10, every_records=100, planned_steps=5, seed=3)
    record.feed(recs)
    assert record.privacy_report()["unit"] == "record" and "max_records_per_key" not in record.privacy_report()
    with pytest.raises(ValueError, match="needs the key of every arrival"):
        PrivateLearner("logistic", **{**base, "key_field": None}).feed(recs)


def test_config_unit():
    assert config_from_dict({}, env={}).privacy.unit == "record"
    cfg = config_from_dict({"privacy": {"unit": "key", "max_records_per_key": 3}}, env={})
    assert (cfg.privacy.unit, cfg.privacy.max_records_per_key, cfg.privacy.key_field) == ("key", 3, None)
    with pytest.raises(ConfigError, match=r"^privacy\.unit: key is not supported by the lda family"):
        config_from_dict({"model": {"family": "lda", "params": {"vocabulary": ["a", "b", "c"], "n_topics": 2}},
                          "privacy": {"unit": "key"}}, env={})
    with pytest.raises(ConfigError, match=r"^privacy\.max_records_per_key"):
        config_from_dict({"privacy": {"unit": "key", "max_records_per_key": 0}}, env={})
    with pytest.raises(ConfigError, match=r"^privacy\.unit"):
        config_from_dict({"privacy": {"unit": "person"}}, env={})


def test_key_ids():
    ids, has = key_ids([b"ann", "ann", 42, "42", None, 1.5, True, "042", b"\xff\xfe", np.int64(42), np.bool_(True)])
    assert has.tolist() == [True, True, True, True, False, False, False, True, True, True, False]
    assert ids[0] == ids[1] and ids[2] == ids[3] == ids[9] != ids[7]  # "042" is not canonical: another key
    assert key_ids(np.array([42]))[0][0] == ids[2]


def test_one_person_is_one_unit_whatever_the_spelling_of_the_key():
    """A key whose type or Unicode normal form changes (42 / "42" / b"42"; composed and decomposed
    "José") is one unit: one slot, so the person's summed contribution stays within the bound C
    the noise assumes (it was two slots and 2 C)."""
    import unicodedata

    nfc, nfd = unicodedata.normalize("NFC", "José"), unicodedata.normalize("NFD", "José")
    assert nfc != nfd
    for spellings in ([42, "42", b"42"], [nfc, nfd, nfd.encode()]):
        learner = PrivateLearner("linreg", dim=2, reservoir=8, batch_size=4, every_records=10**9, seed=1,
                                 unit="key", max_records_per_key=3, key_field="user")
        person = [{"user": k, "x": [1.0, 0.0], "y": 1.0} for k in spellings] * 2
        learner.feed(person + [{"user": f"other{i}", "x": [1.0, 0.0], "y": 1.0} for i in range(7)])
        ids, _ = key_ids(spellings)
        slots = np.flatnonzero(np.isin(learner.reservoir.owners(), ids))
        assert slots.size == 1, spellings
        rows, groups, n = learner.reservoir.take_groups(slots)
        sums = learner.model.group_clipped_sum(rows, groups, n)
        norm = np.sqrt(sum(float(np.sum(np.asarray(v) ** 2)) for v in sums.values()))
        assert norm <= learner.model.joint_bound() * (1 + 1e-9)


def test_a_reservoir_state_of_another_key_id_scheme_is_refused():
    """Owners are stored as ids: under another key -> id mapping a restored slot and a new one
    could belong to one person, so such a state is refused rather than restored."""
    res = KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(0))
    _offer(res, ["a", "b", "c"], [1.0, 2.0, 3.0])
    state = res.get_state()
    KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(1)).set_state(state)
    with pytest.raises(ValueError, match="maps keys to ids under scheme 1"):
        unversioned = {k: v for k, v in state.items() if k != "key_ids"}
        KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(1)).set_state(unversioned)


def test_plan_unit_key_and_the_group_privacy_trade_off(capsys):
    from stream_vips.cli import plan
    key = plan.plan("poisson", 100, 1000, 20, 1e-5, noise_multiplier=5.0, unit="key", max_records_per_key=4)
    record = plan.plan("poisson", 100, 1000, 20, 1e-5, noise_multiplier=5.0)
    assert key["epsilon"] == record["epsilon"]  # the same event, with the key slot as the unit
    assert (key["unit"], key["max_records_per_key"], record["unit"]) == ("key", 4, "record")
    eps = record["epsilon"]
    rows = {g["records"]: g for g in key["group_privacy"]}
    assert sorted(rows) == [2, 4, 10, 100]
    assert rows[4]["epsilon"] == pytest.approx(4 * eps)
    assert rows[4]["delta"] == pytest.approx(min(1.0, 4 * np.exp(3 * eps) * 1e-5))
    with pytest.raises(ValueError, match="needs --unit key"):
        plan.plan("poisson", 100, 1000, 20, 1e-5, noise_multiplier=5.0, max_records_per_key=2)
    assert plan.main(["--sampling", "fixed", "--batch-size", "10", "--reservoir", "100", "--steps", "5",
                      "--delta", "1e-5", "--noise-multiplier", "4", "--unit", "key", "--max-records-per-key", "3"]) == 0
    out = capsys.readouterr().out
    assert "unit:             key" in out and "at most 3" in out and "group-privacy bound" in out


def test_the_pipeline_passes_keys_from_the_key_field_and_the_message_key():
    """`stream-vips run` with unit: key: keys come from privacy.key_field when set (it wins over
    the message key), else from the source's message key; arrivals without one are dead letters
    (missing_key) and keep their positions."""
    import json as _json

    from connectors.memory import MemoryDeadLetterSink, MemorySink
    from stream_vips.io import RawRecord
    from stream_vips.service.app import Application

    class KeyedSource:
        def __init__(self, raws):
            self.raws, self.done = list(raws), False

        def poll(self, max_records, timeout_s):
            out, self.raws = self.raws[:max_records], self.raws[max_records:]
            return out

        def commit(self, positions=None): ...

        def pause(self): ...

        def resume(self): ...

        @property
        def exhausted(self):
            return not self.raws

        def close(self): ...

    rng = np.random.default_rng(4)
    raws = []
    for i in range(3000):
        x = rng.uniform(-0.5, 0.5, 2).tolist()
        doc = {"x": x, "y": float(sum(x)), **({"user": f"u{i % 97}"} if i % 50 else {})}
        raws.append(RawRecord(_json.dumps(doc).encode(), {"key": f"k{i % 13}".encode(), "offset": i}))

    def run(key_field):
        cfg = config_from_dict({
            "model": {"family": "linreg", "params": {"dim": 2}},
            "privacy": {"epsilon": 50.0, "noise_multiplier": 3.0, "unit": "key", "key_field": key_field,
                        "max_records_per_key": 2, "ledger": {"type": "memory"}},
            "sampling": {"reservoir": 10, "batch_size": 5}, "schedule": {"every_records": 500},
            "metrics": {"enabled": False}, "runtime": {"on_halt": "exit", "publish_interval_s": 0},
        }, env={})
        dead = MemoryDeadLetterSink()
        app = Application.from_config(cfg, source=KeyedSource(raws), sink=MemorySink(), dead_letter=dead)
        return app, app.run(), dead

    app, stats, dead = run("user")
    assert stats.updates > 0 and app.reservoir.seen == 3000
    # every 50th has no user
    assert {letter.reason for letter in dead.letters} == {"missing_key"} and len(dead.letters) == 60
    app, stats, dead = run(None)  # the message key: all present
    assert stats.updates > 0 and not dead.letters


def test_a_ledger_paid_per_record_is_not_continued_at_key_level(tmp_path):
    """Record-unit steps bound one record; a person with k records in the reservoir lost up to k
    times more in them (group privacy), so composing them as key-level steps under-counts. The
    switch record -> key is refused before anything is read; key -> record is sound and runs."""
    from stream_vips.privacy.ledger import FileLedger, LedgerMismatch

    path = tmp_path / "ledger.jsonl"
    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 0.5, size=(150, 2))
    records = [{"x": [float(a), float(b)], "y": float(a - b)} for a, b in X]
    common = dict(dim=2, reservoir=50, batch_size=50, every_records=10, epsilon=4.0, planned_steps=20,
                  ledger_path=path, seed=3)
    with PrivateLearner("linreg", unit="key", max_records_per_key=4, **common) as keyed:
        keyed.feed(records, keys=[f"k{i % 60}" for i in range(150)])
        key_steps = keyed.engine.monitor.steps
    with PrivateLearner("linreg", **common) as per_record:  # key -> record: a record is part of one key
        per_record.feed(records)
        steps = per_record.engine.monitor.steps
    assert 0 < key_steps < steps
    with pytest.raises(LedgerMismatch, match=rf"holds {steps - key_steps} steps not marked as key-level"):
        PrivateLearner("linreg", unit="key", max_records_per_key=4, **common)
    with FileLedger(path) as ledger:  # nothing appended by the refused start
        assert len(ledger.events()) == steps
        assert [e.privacy_unit for e in ledger.events()] == ["key"] * key_steps + ["record"] * (steps - key_steps)


# -- The key reservoir's contract, pinned line by line (the mutation pass, tools/mutation.py) ------


def _filled_reservoir(K=16, L=3, seed=3, n=3000, reject_every=5):
    """A reservoir fed a heavy-tailed key stream in uneven batches, every 5th arrival rejected:
    it has replaced keys (new owners with fewer than L records) and rejected cells."""
    keys, vals = _stream(seed, n=n)
    ok = np.arange(n) % reject_every != 0
    res = KeyReservoir(LAYOUT, K, L, np.random.default_rng(seed))
    for lo, hi in [(0, 7), (7, 1200), (1200, n)]:
        res.add_batch({"x": vals[lo:hi][ok[lo:hi]] + 10.0}, keys[lo:hi], accepted=ok[lo:hi])  # no value is 0
    return res


def _same_state(a, b):
    sa, sb = a.get_state(), b.get_state()
    assert sa.keys() == sb.keys()
    for key in sa:
        if key == "columns":
            assert all(np.array_equal(sa[key][c], sb[key][c]) and sa[key][c].dtype == sb[key][c].dtype
                       for c in sa[key]), key
        elif isinstance(sa[key], np.ndarray):
            assert np.array_equal(sa[key], sb[key]) and sa[key].dtype == sb[key].dtype, key
        else:
            assert sa[key] == sb[key], key


@pytest.mark.parametrize("name", ["capacity", "max_records_per_key"])
def test_a_key_reservoir_refuses_a_size_that_is_not_a_positive_integer_and_names_it(name):
    sizes = {"capacity": 3, "max_records_per_key": 2}
    for bad in (0, -1, True, 2.5, "3", None):
        with pytest.raises(ValueError, match=rf"^key reservoir {name} must be a positive integer, got {bad!r}$"):
            KeyReservoir(LAYOUT, **{**sizes, name: bad}, rng=np.random.default_rng(0))
    res = KeyReservoir(LAYOUT, **{**sizes, name: np.int64(4)}, rng=np.random.default_rng(0))
    assert (res.capacity, res.max_records_per_key) == tuple(4 if k == name else v for k, v in sizes.items())


def test_a_key_reservoir_keeps_the_dtype_of_each_column():
    layout = {"n": (np.int32, ()), "v": (np.float32, (2,)), "b": (np.bool_, ())}
    res = KeyReservoir(layout, 2, 2, np.random.default_rng(0))
    assert res.layout == {"n": (np.dtype(np.int32), ()), "v": (np.dtype(np.float32), (2,)), "b": (np.dtype(bool), ())}
    rows = {"n": np.array([7, 8, 9], dtype=np.int32), "v": np.ones((3, 2), dtype=np.float32),
            "b": np.array([True, False, True])}
    res.add_batch(rows, np.array([1, 1, 2]))
    taken, groups, n = res.take_groups(np.arange(res.size))
    assert {c: a.dtype for c, a in taken.items()} == {c: dt for c, (dt, _) in res.layout.items()}
    assert {c: a.dtype for c, a in res.get_state()["columns"].items()} == {c: dt for c, (dt, _) in res.layout.items()}
    assert sorted(taken["n"].tolist()) == [7, 8, 9] and n == 2


def test_only_valid_records_are_taken_and_every_other_cell_holds_zeros():
    """A slot taken over by a new key restarts empty, and a rejected arrival's cell is a null
    record: take_groups returns exactly the valid held records, and no former owner's or
    rejected record's value is kept (nor written to a checkpoint)."""
    res = _filled_reservoir()
    state = res.get_state()
    renewed_short = (state["occupied"].sum(axis=1) < res.max_records_per_key).sum()
    assert renewed_short > 0 and (state["occupied"] & ~state["valid"]).any()  # the cases this test is about
    assert not (state["valid"] & ~state["occupied"]).any()
    taken, groups, n = res.take_groups(np.arange(res.size))
    assert n == res.size and groups.size == int(res.valid.sum()) == int(state["valid"].sum())
    assert np.array_equal(np.bincount(groups, minlength=n), state["valid"].sum(axis=1))
    assert np.array_equal(np.sort(taken["x"]), np.sort(state["columns"]["x"][state["valid"]]))
    assert (taken["x"] != 0).all() and (state["columns"]["x"][~state["valid"]] == 0).all()


def test_taking_key_slots_checks_the_indices_and_returns_integer_groups():
    res = KeyReservoir(LAYOUT, 4, 2, np.random.default_rng(0))
    res.add_batch({"x": np.array([1.0, 2.0, 3.0])}, np.array([5, 6, 5]))
    assert res.size == 2 and not res.full
    rows, groups, n = res.take_groups([])
    assert rows["x"].shape == (0,) and groups.shape == (0,) and n == 0
    rows, groups, n = res.take_groups([1, 0, 1])
    assert groups.dtype == np.intp and groups.tolist() == [0, 1, 1, 2] and n == 3
    assert rows["x"].tolist() == [2.0, 1.0, 3.0, 2.0]
    for bad in ([-1], [2], [0, 3]):  # slot 2 exists but has no owner yet
        with pytest.raises(IndexError, match=r"key slot index out of range \[0, 2\)"):
            res.take_groups(bad)


def test_an_empty_batch_consumes_no_position_and_no_draw():
    a = KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(4))
    b = KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(4))
    keys, vals = _stream(2, n=200, n_keys=10)
    a.add_batch({"x": vals[:50]}, keys[:50])
    b.add_batch({"x": vals[:50]}, keys[:50])
    b.add_batch({"x": np.zeros(0)}, np.zeros(0, dtype=np.int64))
    assert b.seen == a.seen == 50
    a.add_batch({"x": vals[50:]}, keys[50:])
    b.add_batch({"x": vals[50:]}, keys[50:])
    _same_state(a, b)


def test_masks_of_zeros_and_ones_are_read_as_booleans():
    """``accepted`` and ``has_key`` as 0/1 integers (e.g. from a JSON list) decide as the
    boolean masks do (an integer array is not an index)."""
    keys, vals = _stream(5, n=300, n_keys=20)
    ok = np.arange(300) % 4 != 1
    present = np.arange(300) % 7 != 3
    a = KeyReservoir(LAYOUT, 6, 2, np.random.default_rng(8))
    b = KeyReservoir(LAYOUT, 6, 2, np.random.default_rng(8))
    a.add_batch({"x": vals[ok]}, keys, accepted=ok, has_key=present)
    b.add_batch({"x": vals[ok]}, keys, accepted=ok.astype(int).tolist(), has_key=present.astype(int).tolist())
    _same_state(a, b)
    assert np.isin(b.owners(), key_ids(keys)[0][present]).all()  # only keyed arrivals own slots


def test_an_accepted_mask_of_the_wrong_length_or_count_is_refused():
    res = KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(0))
    keys = np.array([1, 2, 3])
    with pytest.raises(ValueError, match="accepted mask has 3 True entries of 4 for 3 rows and 3 keys"):
        res.add_batch({"x": np.ones(3)}, keys, accepted=[True, True, True, False])
    with pytest.raises(ValueError, match="accepted mask has 2 True entries of 3 for 3 rows and 3 keys"):
        res.add_batch({"x": np.ones(3)}, keys, accepted=[True, False, True])
    assert res.seen == 0 and res.size == 0


def test_a_restored_key_reservoir_holds_the_same_keys_and_records_and_admits_the_same_arrivals():
    """set_state of get_state, into a reservoir that held other keys and more of them: the same
    owners, records, validity, counts and generators, nothing left of what it held before, and
    the same decisions on the next arrivals as the reservoir that was never stopped. Also from a
    state whose arrays went through lists (owner ids on both sides of 2**63)."""
    keys, vals = _stream(6, n=2000, n_keys=400)

    def first_part(n_first):
        res = KeyReservoir(LAYOUT, 12, 3, np.random.default_rng(1))
        ok = np.arange(n_first) % 3 != 0
        res.add_batch({"x": vals[:n_first][ok] + 10.0}, keys[:n_first], accepted=ok)
        return res

    for n_first in (6, 1500):  # not yet full (owners < K), and full with replacements
        state = first_part(n_first).get_state()
        as_lists = {**state, "owners": state["owners"].tolist(), "counts": state["counts"].tolist(),
                    "valid": state["valid"].tolist(), "occupied": state["occupied"].tolist(),
                    "columns": {c: v.tolist() for c, v in state["columns"].items()}}
        if n_first > 12:
            assert (state["owners"] >= 2**63).any() and (state["owners"] < 2**63).any()
        for restored in (state, as_lists):
            a = first_part(n_first)
            b = KeyReservoir(LAYOUT, 12, 3, np.random.default_rng(2))
            b.add_batch({"x": np.full(2000, 5.0)}, np.arange(2000) + 10**6)  # full, of other keys
            b.set_state(restored)
            _same_state(a, b)
            assert (b.size, b.full, b.seen, b.records_held, b.tracked_keys) == \
                   (a.size, a.full, a.seen, a.records_held, a.tracked_keys)
            assert np.array_equal(b.valid, a.valid) and np.array_equal(b.held_per_slot(), a.held_per_slot())
            assert np.array_equal(b.take_groups(np.arange(b.size))[0]["x"], a.take_groups(np.arange(a.size))[0]["x"])
            for res in (a, b):
                res.add_batch({"x": vals[n_first:]}, keys[n_first:])
            _same_state(a, b)
            assert a.full and np.array_equal(a.owners(), b.owners())


def test_a_key_reservoir_state_of_other_sizes_or_with_repeated_owners_is_refused():
    res = KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(0))
    res.add_batch({"x": np.arange(4.0)}, np.array([1, 2, 3, 1]))
    state = res.get_state()
    for other in ({"capacity": 4}, {"max_records_per_key": 3}, {"capacity": 4, "max_records_per_key": 3}):
        with pytest.raises(ValueError, match=r"^reservoir state has \d key slots of \d, this reservoir 3 of 2$"):
            KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(0)).set_state({**state, **other})
    owners = state["owners"]
    for bad in (np.array([owners[0], owners[0], owners[2]]), owners[:2], np.append(owners, np.uint64(9))):
        with pytest.raises(ValueError, match="owners must be one distinct id per filled slot"):
            KeyReservoir(LAYOUT, 3, 2, np.random.default_rng(0)).set_state({**state, "owners": bad})


def _blake(data: bytes) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def test_key_ids_of_every_spelling_and_container():
    """Text is hashed as its UTF-8 (BLAKE2b, 8 bytes, little-endian), bytes that are not UTF-8
    as they are; integers of any sign agree between Python, numpy scalars, numpy arrays and
    decimal text; arrays of text or bytes are read key by key, and the mask is boolean."""
    ids, has = key_ids(["ann", b"ann", bytearray(b"ann"), memoryview(b"ann"), b"\xff\xfe", "\xff\xfe"])
    assert has.dtype == bool and has.all()
    assert ids.tolist() == [_blake(b"ann")] * 4 + [_blake(b"\xff\xfe"), _blake("\xff\xfe".encode())]
    assert ids[4] != ids[5]  # invalid UTF-8 is not read as Latin-1 text
    ints = [-1, 1, -(2**63), 2**63 - 1, 0]
    ids, has = key_ids(ints)
    for other in (key_ids(np.array(ints, dtype=np.int64)), key_ids([np.int64(k) for k in ints]),
                  key_ids([str(k) for k in ints]), key_ids(np.array(ints, dtype=np.int64).view(np.uint64))):
        assert np.array_equal(other[0], ids) and other[1].dtype == bool and other[1].all()
    assert len(set(ids.tolist())) == len(ints)
    words = ["ann", "bob", "42", "José"]
    for arr in (np.array(words), np.array(words, dtype=object)):
        assert np.array_equal(key_ids(arr)[0], key_ids(words)[0])
    raw = [w.encode() for w in words]
    assert np.array_equal(key_ids(np.array(raw))[0], key_ids(words)[0])
    ids, has = key_ids(np.array(["a", None, 3, 2.5], dtype=object))
    assert has.tolist() == [True, False, True, False] and ids[2] == key_ids([3])[0][0]


def test_distinct_keys_get_distinct_ids_and_one_key_the_same_id_in_every_process():
    import subprocess
    import sys

    keys = [*range(-50_000, 50_000), *(f"user-{i}" for i in range(50_000)), *(f"u{i}".encode() for i in range(50_000))]
    ids, has = key_ids(keys)
    assert has.all() and np.unique(ids).size == len(keys)  # 2e5 keys: a collision has odds ~1e-9
    again, _ = key_ids(keys[::-1])
    assert np.array_equal(again[::-1], ids)
    probe = [0, -7, 2**64 - 1, "ann", "José", b"\xff\x00"]
    code = ("import sys, json; from stream_vips.core.data.key_reservoir import key_ids; "
            f"print(json.dumps(key_ids({probe!r})[0].tolist()))")
    import json
    import os

    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # str hashing differs between processes; ids must not
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert json.loads(out) == key_ids(probe)[0].tolist()


_M64 = (1 << 64) - 1
#: splitmix64 (Steele, Lea and Flood 2014; Vigna's splitmix64.c): the output function's
#: constants, and the generator's increment (the golden ratio) used below to check published outputs.
_C1, _C2, _GOLDEN = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15


def _mix64_reference(x: int) -> int:
    """splitmix64's output function on Python ints, written from the C reference."""
    x = ((x ^ (x >> 30)) * _C1) & _M64
    x = ((x ^ (x >> 27)) * _C2) & _M64
    return x ^ (x >> 31)


def _unmix64(z: np.ndarray) -> np.ndarray:
    """The inverse of the finaliser: undo each xorshift and multiply by each constant's inverse mod 2**64."""
    def unxorshift(y, s):
        x = y.copy()
        for _ in range(64 // s + 1):
            x = y ^ (x >> np.uint64(s))
        return x

    with np.errstate(over="ignore"):
        z = unxorshift(z, 31)
        z = unxorshift(z * np.uint64(pow(_C2, -1, 1 << 64)), 27)
        return unxorshift(z * np.uint64(pow(_C1, -1, 1 << 64)), 30)


def test_mix64_is_splitmix64s_finaliser():
    """The published splitmix64 outputs (the generator adds the golden-ratio increment to its
    state and returns the finaliser of the state): seed 1234567 (the Rosetta Code task's check
    values) and seed 0 (0xE220A8397B1DCDAF, the first output of splitmix64.c seeded 0); then the
    Python-int reference on random and edge inputs."""
    from stream_vips.core.data.key_reservoir import _mix64

    states = np.array([(1234567 + k * _GOLDEN) & _M64 for k in range(1, 6)], dtype=np.uint64)
    assert _mix64(states).tolist() == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                                       4593380528125082431, 16408922859458223821]
    assert int(_mix64(np.array([_GOLDEN], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF
    r = np.random.default_rng(0)
    xs = np.concatenate([r.integers(0, 2**64 - 1, 5000, dtype=np.uint64, endpoint=True),
                         np.array([0, 1, 2**31, 2**32, 2**63, 2**64 - 1], dtype=np.uint64)])
    assert _mix64(xs).tolist() == [_mix64_reference(x) for x in xs.tolist()]
    before = xs.copy()
    _mix64(xs)
    assert np.array_equal(xs, before)  # the input is left alone


def test_mix64_is_a_bijection_that_spreads_every_bit():
    """Distinct integer keys keep distinct ids (no collision among 1e5 sequential integers, and
    the inverse recovers a random sample), and flipping any one input bit flips about half of
    the output bits (avalanche), so nearby keys (user ids 1, 2, 3) are far apart as ids."""
    from stream_vips.core.data.key_reservoir import _mix64

    seq = _mix64(np.arange(100_000, dtype=np.uint64))
    assert np.unique(seq).size == 100_000
    r = np.random.default_rng(1)
    xs = r.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True)
    assert np.array_equal(_unmix64(_mix64(xs)), xs)
    base = _mix64(xs[:2000])
    flips = np.empty(64)
    for bit in range(64):
        diff = base ^ _mix64(xs[:2000] ^ np.uint64(1 << bit))
        flips[bit] = np.unpackbits(diff.view(np.uint8)).sum() / 2000
    assert 31.5 < flips.mean() < 32.5 and flips.min() > 30 and flips.max() < 34, flips
    low = np.unpackbits(seq[:1000].view(np.uint8)).reshape(1000, 64).mean(axis=0)
    assert low.min() > 0.4 and low.max() < 0.6  # every output bit is used by keys 0..999
