"""Privacy rule 14: a sharded run releases what one process releases, through one wall.

The shards run in this process (LocalPool, the reference run); tests/test_distributed_ray.py runs
the same shards as Ray actors and checks they equal this.
"""

from __future__ import annotations

import itertools
import json
import math
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_vips.config import ConfigError
from stream_vips.core import engine as engine_module
from stream_vips.core.data.sampling import FixedSizeSampler
from stream_vips.core.learner import PrivateLearner
from stream_vips.distributed import (
    LocalPool,
    Plan,
    Shard,
    ShardContribution,
    ShardedLearner,
    ShardFailure,
    ShardStatus,
    capacities,
    owned_partitions,
    window_length,
)
from stream_vips.distributed.checkpoint import ShardCheckpointError
from stream_vips.errors import ReservoirNotFull
from stream_vips.io import RawRecord
from stream_vips.service.build import config_from_dict

M = 60


def settings(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"family": "linreg", "params": {"dim": 2}},
        "sampling": {"reservoir": M, "batch_size": 12, "method": "poisson"},
        "schedule": {"every_records": 30},
        "privacy": {"epsilon": 3.0, "seed": 5, "ledger": {"type": "memory"}, "planned_steps": 8},
        "runtime": {"shards": 2},
    }
    for section, values in over.items():
        base[section] = {**base.get(section, {}), **values}
    return base


def records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.5, 0.5, (n, 2))
    y = x @ np.array([0.8, -0.4]) + 0.05 * rng.standard_normal(n)
    return [{"x": row.tolist(), "y": float(t)} for row, t in zip(x, y)]


def split(batch: list[Any], shards: int) -> list[list[Any]]:
    """Records to shards as partitions would send them: arrival a goes to shard a mod N."""
    return [batch[i::shards] for i in range(shards)]


def sharded(over: dict[str, Any] | None = None, shards: int = 2) -> ShardedLearner:
    over = dict(over or {})
    over["runtime"] = {**over.get("runtime", {}), "shards": shards}
    cfg = config_from_dict(settings(**over), env={})
    return ShardedLearner(cfg, LocalPool(cfg, shards))


def one_process(over: dict[str, Any] | None = None) -> PrivateLearner:
    over = dict(over or {})
    over["runtime"] = {**over.get("runtime", {}), "shards": 1}
    return PrivateLearner.from_config(config_from_dict(settings(**over), env={}))


def run_sharded(learner: ShardedLearner, data: list[Any], chunk: int = 30,
                keys: list[str] | None = None) -> None:
    """Feed ``data`` in chunks; with ``keys``, each record goes to the shard of its key's
    partition (as Kafka's default partitioner sends one key to one partition)."""
    n = learner.pool.shards
    for start in range(0, len(data), chunk):
        part = data[start:start + chunk]
        if keys is None:
            learner.feed(split(part, n))
            continue
        key_part = keys[start:start + chunk]
        shard_of = [zlib.crc32(k.encode()) % n for k in key_part]
        learner.feed([[r for r, s in zip(part, shard_of) if s == i] for i in range(n)],
                     [[k for k, s in zip(key_part, shard_of) if s == i] for i in range(n)])


# -- the ledger event and epsilon: the same as one process -----------------------------------

CASES = {
    "poisson": {},
    "fixed": {"sampling": {"method": "fixed"}},
    "fixed, uneven slices": {"sampling": {"method": "fixed", "reservoir": 61}},
    "key unit": {"privacy": {"unit": "key", "max_records_per_key": 2}},
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("shards", [2, 3])
def test_ledger_event_of_a_sharded_run_is_the_one_process_event(name: str, shards: int) -> None:
    over = CASES[name]
    data = records(240)
    keys = [f"person-{i % 150}" for i in range(len(data))] if "key" in name else None
    one = one_process(over)
    one.feed(data, keys=keys)
    with sharded(over, shards) as many:
        run_sharded(many, data, keys=keys)
        assert many.steps_taken >= 4
        assert many.engine.noise_multiplier == one.engine.noise_multiplier
        assert (many.engine.q, many.engine.normaliser) == (one.engine.q, one.engine.normaliser)
        assert many.engine.event() == one.engine.event()
        assert many.ledger is not None
        assert many.ledger.events() == [one.engine.event()] * many.steps_taken
        steps = min(one.steps_taken, many.steps_taken)
        assert one.ledger is not None and one.monitor is not None and many.monitor is not None
        # the same events compose to the same epsilon, whatever the shard count
        assert many.ledger.events()[:steps] == one.ledger.events()[:steps]
        if one.steps_taken == many.steps_taken:
            assert many.epsilon_spent == pytest.approx(one.epsilon_spent, rel=1e-12)
        report = many.message()["privacy"]
        assert report["q"] == one.privacy_report()["q"] and report["unit"] == one.unit


def test_epsilon_after_equal_steps_is_the_one_process_epsilon() -> None:
    data = records(240)
    one = one_process()
    one.feed(data)
    with sharded() as many:
        run_sharded(many, data)
        assert many.steps_taken == one.steps_taken == 7  # a step every 30 arrivals once M = 60 are in
        assert many.epsilon_spent == one.epsilon_spent


# -- exactly one noise draw per step, at the driver ----------------------------------------------

def test_one_noise_draw_per_block_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    draws: list[tuple[str, Any]] = []
    real_gaussian, real_symmetric = engine_module.gaussian_noise, engine_module.symmetric_noise

    def gaussian(rng: np.random.Generator, shape: Any, std: float) -> np.ndarray:
        draws.append(("gaussian", tuple(np.atleast_1d(shape))))
        return real_gaussian(rng, shape, std)

    def symmetric(rng: np.random.Generator, d: int, std: float) -> np.ndarray:
        draws.append(("symmetric", d))
        return real_symmetric(rng, d, std)

    monkeypatch.setattr(engine_module, "gaussian_noise", gaussian)
    monkeypatch.setattr(engine_module, "symmetric_noise", symmetric)
    with sharded(shards=3) as many:
        run_sharded(many, records(240))
        blocks = len(many.model.blocks())
        assert many.steps_taken >= 4
        assert len(draws) == blocks * many.steps_taken  # once per block and step, not once per shard
        assert Counter(kind for kind, _ in draws) == Counter(
            {"symmetric": many.steps_taken, "gaussian": (blocks - 1) * many.steps_taken})


# -- the driver never receives a record ------------------------------------------------------------

class Recording(LocalPool):
    """A local pool that keeps every answer the driver got."""

    answers: list[Any]

    def call(self, method: str, args: Any, timeout_s: float | None = None) -> list[Any]:
        out = super().call(method, args, timeout_s)
        self.answers.extend(out)
        return out


def test_the_driver_receives_public_counts_and_per_block_sums_only() -> None:
    cfg = config_from_dict(settings(sampling={"method": "fixed"}), env={})
    pool = Recording(cfg, 2)
    pool.answers = []
    with ShardedLearner(cfg, pool) as many:
        run_sharded(many, records(240))
        shapes = {b.name: tuple(b.shape) for b in many.model.blocks()}
        assert many.steps_taken >= 4
        kinds = Counter(type(a).__name__ for a in pool.answers)
        assert set(kinds) == {"ShardStatus", "ShardContribution"}
        assert kinds["ShardContribution"] == 2 * many.steps_taken
        for answer in pool.answers:
            if isinstance(answer, ShardContribution):
                # one sum per block, shaped by the model: no rows, no indices, no batch size
                assert {k: np.shape(v) for k, v in answer.sums.items()} == shapes
                assert set(vars(answer)) == {"index", "sums", "seen"}
            else:
                assert all(isinstance(v, (int, bool, dict)) for v in vars(answer).values())
        # the driver's reservoir is the public sizes: it has no rows to take
        assert not hasattr(many.slices, "take") and not hasattr(many.slices, "take_groups")
        with pytest.raises(AttributeError):
            many.engine.contribution()


class Leaky(Shard):
    """A shard that hands over its sampled rows instead of their clipped sums."""

    def contribution(self, model_state: Any, plan: Plan) -> ShardContribution:
        rows = self.learner.reservoir.take(np.arange(4))  # type: ignore[union-attr]
        return ShardContribution(self.index, {"xx": rows["x"], "xy": rows["x"][:, 0]}, self.status().seen)


def test_a_shard_that_sends_rows_is_refused_before_anything_is_spent() -> None:
    cfg = config_from_dict(settings(), env={})
    with ShardedLearner(cfg, LocalPool(cfg, 2, shard_class=Leaky)) as many:
        many.feed(split(records(M), 2))
        with pytest.raises(ShardFailure, match="not one sum per block"):
            many.step()
        assert many.ledger is not None and many.ledger.events() == []
        assert many.last_step is None


# -- the sampling plan ------------------------------------------------------------------------

def test_fixed_size_plan_draws_a_uniform_subset_of_the_union() -> None:
    """Counts from the multivariate hypergeometric over the public slice sizes, then a uniform
    draw of that many slots in each slice, is a uniform S-subset of all M slots: with slices of
    3 and 2 slots and S = 2, each of the C(5, 2) = 10 pairs has probability 1/10."""
    with sharded({"sampling": {"reservoir": 5, "batch_size": 2, "method": "fixed"},
                  "schedule": {"every_records": 5}}) as many:
        assert many.slices.capacities == [3, 2]
        rng = np.random.default_rng(11)
        seen: Counter[tuple[int, ...]] = Counter()
        trials = 20_000
        for _ in range(trials):
            plans = many.plan()
            assert sum(p.count for p in plans) == 2
            picked = []
            for offset, size, p in zip((0, 3), (3, 2), plans):
                if p.count:
                    picked += (FixedSizeSampler(p.count).sample(size, rng, capacity=size) + offset).tolist()
            seen[tuple(sorted(picked))] += 1
        pairs = list(itertools.combinations(range(5), 2))
        assert set(seen) == set(pairs)
        expected = trials / len(pairs)
        chi2 = sum((seen[p] - expected) ** 2 / expected for p in pairs)
        assert chi2 < 33.7  # the 0.9999 quantile of chi-square with 9 degrees of freedom


def test_poisson_plan_sends_every_shard_the_one_rate() -> None:
    with sharded(shards=3) as many:
        plans = many.plan()
        assert [p.method for p in plans] == ["poisson"] * 3
        assert {p.rate for p in plans} == {12 / M} == {many.engine.q}
        assert many.engine.normaliser == 12.0  # q M, public


def test_the_total_is_the_clipped_sum_over_the_union_of_the_slices() -> None:
    """With S = M every slot is sampled: the driver's total must be the model's clipped sum over
    every record of every slice, none lost and none counted twice."""
    cfg = config_from_dict(settings(sampling={"method": "fixed", "batch_size": M}, runtime={"shards": 3}), env={})
    pool = LocalPool(cfg, 3)
    with ShardedLearner(cfg, pool) as many:
        many.feed(split(records(90), 3))
        total = many.gather(many.plan())
        rows = [s.learner.reservoir.take(np.arange(s.learner.reservoir.capacity))  # type: ignore[union-attr]
                for s in pool.members]
        union = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        expected = many.model.clipped_sum(union)
        for name, value in expected.items():
            np.testing.assert_allclose(total.sums[name], value, rtol=1e-12, atol=1e-12)
        assert total.position == 90


def test_slices_and_partitions_are_fixed_by_the_shard_count() -> None:
    assert capacities(10, 3) == [4, 3, 3] and sum(capacities(61, 2)) == 61
    assert owned_partitions(1, 3, 8) == [1, 4, 7]
    owners = [next(i for i in range(3) if p in owned_partitions(i, 3, 8)) for p in range(8)]
    assert owners == [p % 3 for p in range(8)]


# -- failures spend nothing -------------------------------------------------------------------

class Failing(Shard):
    def contribution(self, model_state: Any, plan: Plan) -> ShardContribution:
        if self.index == 1:
            raise RuntimeError("disk gone")
        return super().contribution(model_state, plan)


def test_a_failing_shard_abandons_the_step_before_anything_is_spent() -> None:
    cfg = config_from_dict(settings(), env={})
    with ShardedLearner(cfg, LocalPool(cfg, 2, shard_class=Failing)) as many:
        assert many.feed(split(records(M), 2)) is None  # the trigger fired; the step was abandoned
        assert many.ledger is not None and many.ledger.events() == [] and many.epsilon_spent == 0.0
        with pytest.raises(ShardFailure, match="shard 1"):
            many.step()
        assert many.ledger.events() == [] and many.last_step is None


def test_no_step_before_every_slice_is_full() -> None:
    with sharded() as many:
        many.feed([records(M // 2), records(M // 2 - 1)])  # shard 1 one short of its slice
        assert not many.slices.full and many.last_step is None
        with pytest.raises(ReservoirNotFull):
            many.step()
        assert many.ledger is not None and many.ledger.events() == []


# -- modes compose or are refused at start ------------------------------------------------------

@pytest.mark.parametrize("over, key", [
    ({"privacy": {"unit": "key", "key_field": "user"}}, "privacy.key_field"),
    ({"runtime": {"shards": 0}}, "runtime.shards"),
    ({"runtime": {"shards": M + 1}}, "runtime.shards"),
    ({"runtime": {"shard_timeout_s": 0}}, "runtime.shard_timeout_s"),
    ({"runtime": {"engine": "spark"}}, "runtime.engine"),
])
def test_refused_at_start_naming_the_key(over: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(settings(**over), env={})
    assert str(info.value).startswith(key) and "\n" not in str(info.value)


def test_a_pool_of_another_size_is_refused() -> None:
    cfg = config_from_dict(settings(), env={})
    with pytest.raises(ConfigError, match="^runtime.shards"):
        ShardedLearner(cfg, LocalPool(cfg, 3))


def test_key_unit_with_the_message_key_composes() -> None:
    with sharded({"privacy": {"unit": "key", "max_records_per_key": 2}}) as many:
        data = records(240)
        run_sharded(many, data, keys=[f"k{i % 150}" for i in range(len(data))])
        assert many.steps_taken >= 1 and many.engine.event().privacy_unit == "key"


WINDOW = {"sampling": {"reservoir_policy": "window"}, "privacy": {"accounting": "window"},
          "schedule": {"every_records": 20}}


@pytest.mark.parametrize("reservoir, shards", [(60, 2), (61, 2), (61, 3)])
def test_window_accounting_uses_the_largest_window_over_the_shards(reservoir: int, shards: int) -> None:
    cfg = config_from_dict(settings(**{**WINDOW, "sampling": {**WINDOW["sampling"], "reservoir": reservoir}},
                                    runtime={"shards": shards}), env={})
    steps, strides = window_length(cfg, shards)
    assert strides is not None and steps is not None
    sizes = capacities(reservoir, shards)
    assert steps == max(math.ceil(m / e) for m, e in zip(sizes, strides))
    if reservoir % shards == 0:
        assert steps == math.ceil(reservoir / 20)  # the one-process L
    # every shard's share of the stride is at least its share of the stream: no window is longer than L
    assert all(e >= 20 * m / reservoir for m, e in zip(sizes, strides))


def test_window_accounting_steps_only_when_every_shard_had_its_arrivals() -> None:
    with sharded(WINDOW) as many:
        one = one_process(WINDOW)
        assert many.window_steps == one.window_steps == 3
        assert many.engine.noise_multiplier == one.engine.noise_multiplier  # calibrated for L steps
        many.feed(split(records(M), 2))
        assert many.steps_taken == 1
        many.feed([records(40), []])  # shard 0 only: shard 1's records would stay for more than L steps
        assert many.steps_taken == 1
        many.feed([[], records(10)])
        assert many.steps_taken == 2
        assert many.ledger is not None and all(e == one.engine.event() for e in many.ledger.events())


def test_rejected_slots_halt_before_spending_over_all_shards() -> None:
    """max_rejected_fraction is checked on the union of the slices (validity is public)."""
    with sharded() as many:
        bad = [{"x": [0.1, 0.2, 0.3], "y": 0.0}] * (M // 2)  # wrong_shape
        many.feed([bad, records(M // 2)])  # half of all slots empty: not more than 0.5
        assert many.steps_taken == 1
    with sharded() as many:
        many.feed([bad, records(M // 2 - 2) + bad[:2]])
        assert many.halted and many.steps_taken == 0 and "wrong_shape" in str(many._refused)
        assert many.ledger is not None and many.ledger.events() == []
        status = many.slices.statuses[0]
        assert isinstance(status, ShardStatus) and status.valid == 0 and status.rows == M // 2


def test_shard_actors_ask_for_the_shard_resource_only_where_a_node_declares_it() -> None:
    """On a cluster whose workers declare the shard resource (k8s/overlays/ray) every shard actor
    asks for one unit of it, so none runs on the head beside the driver; a local cluster without
    it places them anywhere (asking would leave them pending forever)."""
    from stream_vips.distributed.pool import SHARD_RESOURCE, shard_actor_options

    assert shard_actor_options({"CPU": 2.0, SHARD_RESOURCE: 2.0}) == {"num_cpus": 0, "resources": {SHARD_RESOURCE: 1}}
    assert shard_actor_options({"CPU": 2.0}) == {"num_cpus": 0}
    assert shard_actor_options({"CPU": 2.0, SHARD_RESOURCE: 0.0}) == {"num_cpus": 0}


# ---------------------------------------------------------------------------------------------
# shard checkpoints (runtime.checkpoint_path)


class OffsetSource:
    """A seekable source of one partition: ``values`` at offsets 0, 1, ... (Kafka's positions)."""

    def __init__(self, values: list[bytes], partition: int) -> None:
        self.values, self.partition, self.next, self.commits = values, partition, 0, 0

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        start, self.next = self.next, min(len(self.values), self.next + max_records)
        return [RawRecord(self.values[o], {"topic": "t", "partition": self.partition, "offset": o})
                for o in range(start, self.next)]

    def positions(self) -> dict[tuple[str, int], int]:
        return {("t", self.partition): self.next}

    def seek(self, offsets: Any) -> None:
        self.next = offsets[("t", self.partition)]

    def commit(self, positions: Any = None) -> None:
        self.commits += 1

    commit_now = commit

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    @property
    def exhausted(self) -> bool:
        return self.next >= len(self.values)

    def close(self) -> None: ...


def checkpointed(tmp_path: Path, **over: Any) -> Any:
    runtime = {"shards": 2, "checkpoint_path": str(tmp_path / "slices.npz"), "checkpoint_interval_s": 0.0}
    ledger = {"type": "file", "path": str(tmp_path / "ledger.jsonl")}
    return config_from_dict(settings(runtime=runtime, privacy={"ledger": ledger}, **over), env={})


def slots(shard: Shard) -> tuple[int, list[tuple[float, ...]]]:
    """A shard's position and the records in its slots, in slot order (the records' values)."""
    res = shard.learner.reservoir
    columns = res.get_state()["columns"]
    rows = [tuple(np.concatenate([np.ravel(columns[k][i]) for k in sorted(columns)])) for i in range(res.size)]
    return int(res.seen), rows


def test_a_shard_restarted_from_its_checkpoint_holds_the_same_records(tmp_path: Path) -> None:
    cfg = checkpointed(tmp_path)
    pool = LocalPool(cfg, 2)
    learner = ShardedLearner(cfg, pool)
    run_sharded(learner, records(150))
    before = [slots(s) for s in pool.members]
    assert all(seen == 75 and len(rows) == M // 2 for seen, rows in before)
    files = sorted(p.name for p in tmp_path.iterdir() if "shard" in p.name)
    assert files == ["slices.shard0.npz", "slices.shard1.npz"]
    assert all((tmp_path / f).stat().st_mode & 0o777 == 0o600 for f in files)  # raw records: owner only
    learner.close()
    for i in range(2):  # what a restarted actor does: the same constructor, the same arguments
        restarted = Shard(cfg, i, 2)
        assert restarted.restored and restarted.status().full
        assert slots(restarted) == before[i]
    # an empty shard (no checkpoint yet) is not "restored"
    assert not Shard(checkpointed(tmp_path / "other"), 0, 2).restored


def test_a_checkpoint_of_another_shard_is_refused(tmp_path: Path) -> None:
    cfg = checkpointed(tmp_path)
    learner = ShardedLearner(cfg, LocalPool(cfg, 2))
    run_sharded(learner, records(80))
    learner.close()
    (tmp_path / "slices.shard1.npz").replace(tmp_path / "slices.shard0.npz")
    with pytest.raises(ShardCheckpointError, match="shard 1 of 2 given to shard 0 of 2"):
        Shard(cfg, 0, 2)


def test_a_restart_reads_each_record_after_the_checkpoint_once(tmp_path: Path) -> None:
    """A shard that crashed after taking a batch it had not checkpointed comes back from its last
    checkpoint, seeks its source there and ends with the slots of a run without the crash: no
    record lost, none in two slots, the positions those of the stream."""
    data = [json.dumps(r).encode() for r in records(70, seed=3)]
    cfg = checkpointed(tmp_path)
    clean = Shard(config_from_dict(settings(runtime={"shards": 2}), env={}), 0, 2,
                  source=lambda: OffsetSource(data, 0))
    shard = Shard(cfg, 0, 2, source=lambda: OffsetSource(data, 0))
    for _ in range(3):
        shard.poll(10, 0.0)
    saved = (tmp_path / "slices.shard0.npz").read_bytes()
    shard.poll(10, 0.0)  # taken, checkpointed, committed ... and the process dies after it:
    (tmp_path / "slices.shard0.npz").write_bytes(saved)  # as if it died before that checkpoint
    restarted = Shard(cfg, 0, 2, source=lambda: OffsetSource(data, 0))  # the committed offset is not used
    assert restarted.restored and restarted.status().seen == 30
    while not restarted.status().exhausted:
        restarted.poll(10, 0.0)
    while not clean.status().exhausted:
        clean.poll(10, 0.0)
    seen, rows = slots(restarted)
    assert seen == len(data)
    assert len(rows) == M // 2 and len(set(rows)) == len(rows), "a record in two slots"
    # same seed, same positions, the admission generator restored: the slots of the clean run
    assert slots(restarted) == slots(clean)
    assert set(rows) <= {tuple(r["x"]) + (r["y"],) for r in records(70, seed=3)}


def test_epsilon_never_decreases_across_a_driver_restart_on_the_same_ledger(tmp_path: Path) -> None:
    cfg = checkpointed(tmp_path)
    with ShardedLearner(cfg, LocalPool(cfg, 2)) as first:
        run_sharded(first, records(150))
        spent, steps = first.epsilon_spent, first.steps_taken
    assert steps >= 2 and spent > 0
    pool = LocalPool(cfg, 2)
    assert all(s.restored for s in pool.members)
    with ShardedLearner(cfg, pool) as second:
        second.refresh()
        assert second.epsilon_spent >= spent and second.slices.full
        run_sharded(second, records(30, seed=9))  # one trigger's worth: the slices came back full
        assert second.steps_taken >= 1 and second.epsilon_spent > spent
        assert second.last_step is not None and second.last_step >= steps
