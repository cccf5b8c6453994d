"""Admission before decoding (``sampling.validation: admitted``): the reservoir decides from
positions and its RNG which arrivals it keeps, and only those are decoded.

The invariants: admission draws exactly what ``add_batch`` draws (same RNG consumption, so
``all`` stays bit-identical and checkpoints and audits stay valid); the admitted positions do not
depend on record content or validity (the same for a clean stream and one with bad records); the
reservoir, the ledger and the releases are the same with ``all`` and ``admitted``; dead letters
with ``admitted`` are exactly ``all``'s dead letters at admitted positions; restarts, replayed
positions, duplicates and the rejected-fraction guard behave as with ``all``."""

from __future__ import annotations

import numpy as np
import pytest

from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
from connectors.synthetic import SyntheticRegressionSource
from stream_vips import PrivateLearner
from stream_vips.config import ConfigError
from stream_vips.core.data.key_reservoir import KeyReservoir
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.window import WindowReservoir
from stream_vips.io import RecordBatch
from stream_vips.privacy.ledger import MemoryLedger
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict

LAYOUT = {"pos": (np.int64, ())}
DIM = 3


def reservoirs(seed: int) -> dict:
    rng = lambda: np.random.default_rng(seed)  # noqa: E731
    return {"uniform": lambda: Reservoir(LAYOUT, 13, rng()),
            "window": lambda: WindowReservoir(LAYOUT, 13, rng()),
            "sampled window": lambda: WindowReservoir(LAYOUT, 13, rng(), rate=0.3),
            "key": lambda: KeyReservoir(LAYOUT, 5, 2, rng())}


def same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if name == "columns":
            for col in a[name]:
                np.testing.assert_array_equal(a[name][col], b[name][col])
        elif isinstance(a[name], np.ndarray):
            np.testing.assert_array_equal(a[name], b[name])
        else:
            assert a[name] == b[name], name


@pytest.mark.parametrize("kind", ["uniform", "window", "sampled window", "key"])
def test_admit_then_place_is_add_batch_and_names_exactly_the_kept_arrivals(kind):
    """admit() consumes the RNG as add_batch() does, and its arrivals are exactly the positions
    whose content is in the reservoir afterwards (the others could be skipped unread)."""
    make = reservoirs(3)[kind]
    a, b = make(), make()
    g = np.random.default_rng(11)
    start = 0
    for _ in range(40):
        n = int(g.integers(0, 30))
        ok = g.random(n) < 0.8  # rejected arrivals keep their positions in both paths
        pos = np.arange(start, start + n)
        keys = g.integers(0, 9, n)
        extra = {"keys": keys} if kind == "key" else {}
        a.add_batch({"pos": pos[ok]}, accepted=ok, **extra)
        before = b.get_state()
        candidates = b.candidates(n)  # decodable in one pass: a superset, the RNG not advanced
        same_state(before, b.get_state())
        admission = b.admit(keys) if kind == "key" else b.admit(n)
        assert candidates is None if kind == "key" else set(admission.arrivals) <= set(candidates)
        assert np.all(np.diff(admission.arrivals) > 0)  # ascending arrival order
        chosen = admission.arrivals
        b.place(admission, {"pos": pos[chosen][ok[chosen]]}, ok[chosen])
        same_state(a.get_state(), b.get_state())
        start += n
    held = b.get_state()
    kept = held["columns"]["pos"][held["valid"]]
    assert kept.size > 0 and np.all(kept < start)


def test_an_admission_must_be_placed_before_the_next():
    res = Reservoir(LAYOUT, 4, np.random.default_rng(0))
    admission = res.admit(3)
    with pytest.raises(RuntimeError, match="pending"):
        res.admit(2)
    res.place(admission, {"pos": np.arange(3)})
    with pytest.raises(RuntimeError, match="not the reservoir's pending"):
        res.place(admission, {"pos": np.arange(3)})


# -- the learner: the same reservoir, ledger and releases with all and admitted --------------


def lines(n: int, malformed: float, seed: int = 1) -> list[bytes]:
    return SyntheticRegressionSource(count=n, dimension=DIM, seed=seed, malformed_fraction=malformed).generate(n)


def learner(validation: str, ledger: MemoryLedger | None = None, **options) -> PrivateLearner:
    config = {"model": {"family": "linreg", "params": {"dim": DIM}},
              "privacy": {"epsilon": 50.0, "noise_multiplier": 2.0, "seed": 5, "ledger": {"type": "memory"},
                          **options.pop("privacy", {})},
              "sampling": {"reservoir": 300, "batch_size": 30, "validation": validation, **options.pop("sampling", {})},
              "schedule": {"every_records": 100}, "metrics": {"enabled": False}}
    return PrivateLearner(config=config_from_dict(config, env={}), ledger=ledger or MemoryLedger())


def feed(lr: PrivateLearner, values: list[bytes], poll: int, keys: list | None = None) -> list[tuple[int, str]]:
    """Feed in polls of ``poll`` records; (stream position, reason) of every rejection."""
    out = []
    for start in range(0, len(values), poll):
        part = lr.feed(values[start:start + poll], keys=None if keys is None else keys[start:start + poll])
        out += [(start + i, reason) for i, reason, _ in part.rejected]
    return out


POLICIES = {"uniform": {}, "window": {"sampling": {"reservoir_policy": "window"}},
            "sampled window": {"sampling": {"reservoir_policy": "window", "window_rate": 0.4}},
            "key": {"privacy": {"unit": "key", "max_records_per_key": 2},
                    "sampling": {"reservoir": 20, "batch_size": 5}}}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_admitted_learns_exactly_what_all_learns_and_dead_letters_only_admitted_records(policy):
    values = lines(3000, malformed=0.05)
    keys = [None if i % 97 == 0 else f"person-{i % 41}".encode() for i in range(len(values))]
    keys = keys if policy == "key" else None
    runs = {}
    for validation, poll in (("all", 450), ("admitted", 450), ("admitted", 137)):
        lr = learner(validation, **{k: dict(v) for k, v in POLICIES[policy].items()})
        rejected = feed(lr, values, poll, keys)
        runs[(validation, poll)] = (lr, rejected)
    (full, full_rej), (adm, adm_rej), (other, other_rej) = runs.values()
    assert adm.steps_taken == full.steps_taken > 20
    for lr in (adm, other):
        same_state(full.reservoir.get_state(), lr.reservoir.get_state())
        for name, value in full.model.state().items():
            np.testing.assert_array_equal(value, lr.model.state()[name])
        assert [e.to_dict() for e in lr.ledger.events()] == [e.to_dict() for e in full.ledger.events()]
    # Dead letters: a subset of all's that holds all's at every admitted (placed) position. What
    # is decoded besides (arrivals whose draw hit a slot, overwritten within their chunk) depends
    # on positions, draws and where polls end (public), never on content. A keyless arrival takes no
    # slot: it is rejected as missing_key without decoding (with all, an invalid keyless record gets
    # its content reason).
    content = lambda rej: {(p, r) for p, r in rej if r != "missing_key"}  # noqa: E731
    assert content(adm_rej) <= content(full_rej) and content(other_rej) <= content(full_rej) and adm_rej
    if policy != "window":  # the sliding window admits every arrival: nothing to skip
        assert len(adm_rej) < len(full_rej) / 2
    keyless = {p for p, k in enumerate(keys or []) if k is None}
    assert {p for p, r in adm_rej if r == "missing_key"} == keyless
    placed = _admitted_positions(policy, len(values), 450, keys)
    assert {(p, r) for p, r in content(full_rej) if p in placed} <= content(adm_rej)


def _admitted_positions(policy: str, n: int, poll: int, keys: list | None) -> set[int]:
    """Positions an 'admitted' learner places in its reservoir on this stream in polls of
    ``poll``, replayed from the reservoir alone (admission reads no record), in the chunks the
    learner cuts."""
    from stream_vips.core.keys import arrival_keys

    lr = learner("admitted", **{k: dict(v) for k, v in POLICIES[policy].items()})
    ids, has = arrival_keys(keys, n) if keys is not None else (None, None)
    out, start = set(), 0
    while start < n:
        end = start + lr._chunk(min(n, (start // poll + 1) * poll) - start)
        adm = lr.reservoir.admit(end - start) if ids is None else lr.reservoir.admit(ids[start:end], has[start:end])
        out.update((adm.arrivals + start).tolist())
        lr.reservoir.place(adm, {"x": np.zeros((adm.arrivals.size, DIM)), "y": np.zeros(adm.arrivals.size)})
        lr.trigger.observe(end - start)
        if lr.reservoir.full and lr.trigger.due():
            lr.trigger.reset()
        start = end
    return out


def test_admitted_positions_do_not_depend_on_content_or_validity():
    """The privacy invariant: with the same seed, a clean stream and the same stream with bad
    records admit the same positions into the same slots; a rejected admitted record only leaves
    its slot empty (the null record), it never shifts a later admission."""
    clean, bad = lines(2000, 0.0, seed=4), lines(2000, 0.2, seed=4)
    other = lines(2000, 0.0, seed=9)  # different content altogether
    states = {}
    for name, values in (("clean", clean), ("bad", bad), ("other", other)):
        lr = learner("admitted", sampling={"max_rejected_fraction": 1.0})
        feed(lr, values, 333)
        states[name] = lr.reservoir.get_state()
    slots_of = lambda s: (s["seen"], s["rng"])  # noqa: E731
    assert slots_of(states["clean"]) == slots_of(states["bad"]) == slots_of(states["other"])
    empty = ~states["bad"]["valid"]
    assert 0 < empty.sum() < empty.size and states["clean"]["valid"].all()
    # where the bad stream's record was valid, the slot holds the same arrival as the clean stream's
    for col in ("x", "y"):
        np.testing.assert_array_equal(states["bad"]["columns"][col][~empty], states["clean"]["columns"][col][~empty])
        assert not np.any(states["bad"]["columns"][col][empty])


def test_a_checkpoint_restart_admits_the_same_positions_and_skips_paid_steps():
    """A restart restores the reservoir's RNG with its rows: the rest of the stream is admitted
    exactly as without the restart, and positions an earlier life paid for are not paid again."""
    values = lines(2400, malformed=0.05)
    ledger = MemoryLedger()
    through = learner("admitted")
    feed(through, values, 400)
    first = learner("admitted", ledger=ledger)
    feed(first, values[:1000], 400)
    saved = first.state()
    feed(first, values[1000:1600], 400)  # paid for steps up to position 1600, then crashed
    second = learner("admitted", ledger=ledger)
    second.load_state(saved)
    feed(second, values[1000:], 400)
    same_state(through.reservoir.get_state(), second.reservoir.get_state())
    assert second.skipped_steps == 6 and second.steps_taken == 8  # steps at 1100..1600 were paid
    assert len(ledger.events()) == len(through.ledger.events())
    reference = learner("all", ledger=MemoryLedger())
    feed(reference, values, 400)
    same_state(reference.reservoir.get_state(), second.reservoir.get_state())


def test_the_rejected_fraction_guard_halts_at_the_same_step_in_both_modes():
    """Slot validity is identical in both modes, so the guard refuses the same step."""
    values = lines(2000, malformed=0.6)
    halted = {}
    for validation in ("all", "admitted"):
        lr = learner(validation)
        feed(lr, values, 500)
        halted[validation] = (lr.halted, lr.steps_taken, lr.reservoir.seen, float(np.mean(lr.reservoir.valid)))
    assert halted["all"] == halted["admitted"] and halted["all"][0] and halted["all"][1] == 0


def test_configuration_refuses_what_admission_cannot_do():
    base = {"model": {"family": "linreg", "params": {"dim": DIM}}, "sampling": {"validation": "admitted"}}
    assert config_from_dict({}, env={}).sampling.validation == "all"
    with pytest.raises(ConfigError, match=r"^runtime\.decode_workers: must be 0 with sampling\.validation"):
        config_from_dict({**base, "runtime": {"decode_workers": 1}}, env={})
    with pytest.raises(ConfigError, match=r"^privacy\.key_field: 'user' must be decoded"):
        config_from_dict({**base, "privacy": {"unit": "key", "key_field": "user"}}, env={})
    with pytest.raises(ConfigError, match=r"^sampling\.validation: must be one of"):
        config_from_dict({"sampling": {"validation": "some"}}, env={})
    assert config_from_dict({**base, "privacy": {"unit": "key"}}, env={}).sampling.validation == "admitted"


# -- the pipeline: dead letters, metrics, duplicates ------------------------------------------


class ReplayingSource(MemorySource):
    """Kafka-like polls (RecordBatch with offsets) that re-deliver an earlier range once, as a
    rebalance that resumes behind the last commit does."""

    def __init__(self, values: list[bytes], polls: list[tuple[int, int]]) -> None:
        super().__init__([])
        self._values, self._polls = values, list(polls)

    def poll(self, max_records: int, timeout_s: float) -> RecordBatch:
        if not self._polls:
            return RecordBatch([], bytes)
        lo, hi = self._polls.pop(0)
        recs = list(range(lo, hi))
        return RecordBatch([(recs, lambda r: {"topic": "t", "partition": 0, "offset": r})], self._values.__getitem__)

    @property
    def exhausted(self) -> bool:
        return not self._polls


def run_app(validation: str, values: list[bytes], polls: list[tuple[int, int]]) -> tuple:
    config = {"model": {"family": "linreg", "params": {"dim": DIM}},
              "privacy": {"epsilon": 50.0, "noise_multiplier": 2.0, "seed": 5, "ledger": {"type": "memory"}},
              "sampling": {"reservoir": 300, "batch_size": 30, "validation": validation},
              "schedule": {"every_records": 100}, "metrics": {"enabled": False},
              "runtime": {"on_halt": "exit", "poll_timeout_s": 0.0, "publish_interval_s": 0.0}}
    dead = MemoryDeadLetterSink()
    app = Application.from_config(config_from_dict(config, env={}), source=ReplayingSource(values, polls),
                                  sink=MemorySink(), dead_letter=dead)
    stats = app.run()
    samples = [s for m in app.metrics.registry.collect() for s in m.samples if s.name.endswith("_total")]
    rejected = {s.labels["reason"]: s.value for s in samples if s.name.endswith("records_rejected_total")}
    rejected["not_decoded"] = next(s.value for s in samples if s.name.endswith("records_not_decoded_total"))
    letters = sorted((d.record.origin["offset"], d.reason) for d in dead.letters)
    return stats, app.reservoir.get_state(), letters, rejected


def test_pipeline_admitted_dead_letters_metrics_and_duplicates():
    values = lines(2000, malformed=0.05)
    polls = [(0, 500), (500, 900), (700, 1300), (1300, 2000)]  # 700..899 delivered twice
    full, adm = run_app("all", values, polls), run_app("admitted", values, polls)
    (fs, fstate, fdead, frej), (s, state, dead, rej) = full, adm
    same_state(fstate, state)
    assert s.records == fs.records == 2000 and s.duplicates == fs.duplicates == 200
    assert s.updates == fs.updates and fs.not_decoded == 0
    assert 0 < s.not_decoded < 2000 and s.accepted + sum(s.rejected.values()) + s.not_decoded == 2000
    assert set(dead) < set(fdead) and 0 < len(dead)
    # metrics cover admitted records only; the rest are counted as not decoded
    assert rej == {**{reason: float(n) for reason, n in s.rejected.items()}, "not_decoded": float(s.not_decoded)}
    assert frej["not_decoded"] == 0.0
