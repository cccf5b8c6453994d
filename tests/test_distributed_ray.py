"""The shards as Ray actors: the same releases as the local reference, and failures that spend nothing.

One Ray instance per session (2 CPUs, no dashboard, a small object store); the shard actors ask
for no CPU, so a test's shards start together.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
import ray  # the ray extra: .ci/run installs it, so these tests are never skipped

from stream_vips.distributed import LocalPool, Plan, RayPool, Shard, ShardContribution, ShardedLearner
from stream_vips.distributed.pool import ShardFailure
from stream_vips.errors import ReservoirNotFull
from stream_vips.service.build import config_from_dict
from test_distributed import M, records, settings, split


@pytest.fixture(scope="module")
def ray_session() -> Any:
    import ray.cloudpickle as cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's shard classes travel by value
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024,
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def run(learner: ShardedLearner, data: list[Any], chunk: int = 30) -> None:
    for start in range(0, len(data), chunk):
        learner.feed(split(data[start:start + chunk], learner.pool.shards))


def test_ray_shards_release_exactly_what_local_shards_release(ray_session: Any) -> None:
    """Seeded: the same admission, the same samples, the same sums, one noise draw from the
    same generator, so the same messages, bit for bit, and the same ledger."""
    cfg = config_from_dict(settings(sampling={"method": "fixed"}), env={})
    data = records(240)
    with ShardedLearner(cfg, LocalPool(cfg, 2)) as local:
        run(local, data)
        expected = local.message()
        events = local.ledger.events() if local.ledger is not None else None
    pool = RayPool(cfg, 2)
    try:
        with ShardedLearner(cfg, pool) as remote:
            run(remote, data)
            got = remote.message()
            assert remote.ledger is not None and remote.ledger.events() == events
    finally:
        pool.close()
    assert expected is not None and got is not None and got["version"] == expected["version"] >= 4
    assert got["privacy"]["epsilon_spent"] == expected["privacy"]["epsilon_spent"]
    for name, value in expected["natural_parameters"].items():
        assert got["natural_parameters"][name] == value


class Slow(Shard):
    """Shard 1 answers a step late."""

    delay_s = 8.0

    def contribution(self, model_state: Any, plan: Plan) -> ShardContribution:
        if self.index == 1:
            time.sleep(self.delay_s)
        return super().contribution(model_state, plan)


def test_a_slow_shard_abandons_the_step_after_the_timeout_and_nothing_is_spent(ray_session: Any) -> None:
    cfg = config_from_dict(settings(runtime={"shard_timeout_s": 1.0}), env={})
    pool = RayPool(cfg, 2, shard_class=Slow)
    try:
        with ShardedLearner(cfg, pool) as learner:
            learner.feed(split(records(M), 2))  # full, and the trigger is due: the step times out
            assert learner.last_step is None and learner.ledger is not None and learner.ledger.events() == []
            started = time.monotonic()
            with pytest.raises(ShardFailure) as info:
                learner.step()
            assert info.value.cause == "timeout" and time.monotonic() - started < 10
            assert learner.ledger.events() == [] and learner.epsilon_spent == 0.0
    finally:
        ray.kill(pool.actors[1], no_restart=True)
        ray.kill(pool.actors[0], no_restart=True)


def test_a_shard_killed_mid_step_spends_nothing_and_restarts_empty(ray_session: Any) -> None:
    """Ray restarts the shard; it comes back with an empty slice, so no step is taken until it
    is full again, and then steps resume on the same ledger."""
    cfg = config_from_dict(settings(schedule={"every_records": 10_000}), env={})
    pool = RayPool(cfg, 2, shard_class=Slow)
    try:
        with ShardedLearner(cfg, pool) as learner:
            learner.feed(split(records(M), 2))
            assert learner.slices.full and learner.last_step is None
            killer = threading.Timer(1.0, lambda: ray.kill(pool.actors[1], no_restart=False))
            killer.start()
            with pytest.raises(ShardFailure) as info:
                learner.step()
            killer.join()
            assert info.value.cause == "lost"
            assert learner.ledger is not None and learner.ledger.events() == []
            learner.refresh()  # waits for Ray to restart the shard, which comes back empty
            assert not learner.slices.full
            with pytest.raises(ReservoirNotFull):
                learner.step()
            assert learner.ledger.events() == []
    finally:
        pool.close()


def test_shards_refill_after_a_restart_and_steps_resume(ray_session: Any) -> None:
    cfg = config_from_dict(settings(), env={})
    pool = RayPool(cfg, 2)
    try:
        with ShardedLearner(cfg, pool) as learner:
            run(learner, records(120))
            taken = learner.steps_taken
            assert taken >= 2
            ray.kill(pool.actors[0], no_restart=False)
            deadline = time.monotonic() + 60
            while learner.slices.full and time.monotonic() < deadline:  # the kill takes effect
                time.sleep(0.2)
                learner.refresh()
            assert not learner.slices.full and learner.slices.statuses[0].seen == 0
            run(learner, records(120, seed=1))
            assert learner.slices.full and learner.steps_taken > taken
            assert learner.ledger is not None and len(learner.ledger.events()) == learner.steps_taken
            assert np.isfinite(learner.epsilon_spent)
    finally:
        pool.close()


class GoneBroker:
    """A shard's source whose Kafka client gave up: every poll raises the client's timeout."""

    def poll(self, max_records: int, timeout_s: float) -> Any:
        from kafka.errors import KafkaTimeoutError

        raise KafkaTimeoutError("Failed to update metadata after 60.0 secs.")

    def commit(self, *args: Any) -> None: ...

    def close(self) -> None: ...


def test_a_ray_shards_source_failure_reaches_the_driver_whole_and_ends_the_run(ray_session: Any) -> None:
    """Across the actor boundary the source's failure is still a SourceFailed the command can
    classify (the client error itself, its class names) and show in one line; the driver does not
    poll again and nothing is spent."""
    from kafka.errors import KafkaTimeoutError

    from stream_vips.cli.run import connector_failure
    from stream_vips.distributed import SourceFailed

    cfg = config_from_dict(settings(), env={})
    pool = RayPool(cfg, 2, sources=lambda i: GoneBroker)
    try:
        with ShardedLearner(cfg, pool) as learner:
            started = time.monotonic()
            with pytest.raises(SourceFailed) as info:
                learner.run()
            assert time.monotonic() - started < 30
            exc = info.value
            assert exc.index in (0, 1)  # both fail: the first answer Ray reports
            assert exc.summary == f"shard {exc.index}'s source failed in poll: KafkaTimeoutError: KafkaTimeoutError: " \
                                  "Failed to update metadata after 60.0 secs."
            assert "kafka.errors.KafkaTimeoutError" in exc.error_kinds
            assert isinstance(exc.error, KafkaTimeoutError) and connector_failure(exc.error)
            assert learner.ledger is not None and learner.ledger.events() == []
    finally:
        pool.close()


def _refusing_sink() -> Any:
    raise ConnectionRefusedError("dead-letter topic svips-dead: broker refused the connection")


def _second_refuses(i: int) -> Any:
    return _refusing_sink if i == 1 else None


def test_a_shard_that_cannot_open_its_connectors_fails_the_start_in_one_line(ray_session: Any, tmp_path: Any) -> None:
    """A shard's constructor that raises (here shard 1's dead-letter sink refuses) is final: the
    pool's start says so in one line with the cause, not as a lost shard to wait for (Ray does not
    restart an actor whose constructor failed), nothing is built to spend, and the shard that did
    start is closed, not left running with its connectors open."""
    cfg = config_from_dict(settings(), env={})
    started = time.monotonic()
    with pytest.raises(ShardFailure) as info:
        RayPool(cfg, 2, dead_letters=_second_refuses, shard_class=_marking_shard(tmp_path), start_timeout_s=60)
    assert time.monotonic() - started < 30
    assert info.value.cause == "error"
    assert str(info.value) == ("a shard could not start: ConnectionRefusedError: dead-letter topic svips-dead: "
                               "broker refused the connection")
    assert (tmp_path / "closed-0").exists() and not (tmp_path / "closed-1").exists()


def _marking_shard(folder: Any) -> type[Shard]:
    class MarkingShard(Shard):
        def close(self) -> None:
            (folder / f"closed-{self.index}").touch()
            super().close()

    return MarkingShard
