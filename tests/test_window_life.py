"""Window accounting across the service's life: restarts, re-read records, changed settings.

Window accounting (privacy rule 13) reports the most any record spent as the largest epsilon of
L = ceil(M / every_records) consecutive steps. That holds only while every record is in at most
L steps, i.e. while a record's stream position bounds its steps. These tests check the
invariant "no record in more than L steps" through crashes and restarts, and that every way to
break it is refused before anything is spent.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from connectors.memory import MemoryDeadLetterSink, MemorySink
from stream_vips import PrivateLearner
from stream_vips.config import ConfigError
from stream_vips.errors import StepRefused
from stream_vips.io import RawRecord
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import FileLedger, LedgerMismatch
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict

M, EVERY = 1000, 250  # a window of M arrivals and a step every EVERY arrivals: L = 4
L = 4
RNG = np.random.default_rng(0)
RECORDS = [json.dumps({"x": list(RNG.uniform(-0.5, 0.5, 5)), "y": float(RNG.uniform(-1, 1))}).encode()
           for _ in range(6000)]


class Broker:
    """What survives a crash: the consumer group's committed offsets."""

    def __init__(self, partitions: int = 1) -> None:
        self.committed = {("t", p): 0 for p in range(partitions)}


class AtLeastOnceSource:
    """Seekable and at-least-once, like a Kafka consumer: it resumes at the committed offsets and
    commits only every ``every``-th call (what came since is re-read after a crash). With two
    partitions ``order(i)`` says which one the i-th poll reads."""

    exhausted = False

    def __init__(self, broker: Broker, every: int = 1, order=lambda i: 0) -> None:
        self.broker, self.every, self.order = broker, every, order
        self.next = dict(broker.committed)
        self.calls = self.polls = 0

    def poll(self, n: int, timeout: float) -> list[RawRecord]:
        parts = sorted(p for _, p in self.next)
        p = parts[self.order(self.polls) % len(parts)]
        self.polls += 1
        start = self.next[("t", p)]
        values = RECORDS[start:start + n]
        self.next[("t", p)] = start + len(values)
        self.exhausted = all(o >= len(RECORDS) for o in self.next.values())
        return [RawRecord(v, {"topic": "t", "partition": p, "offset": o}) for o, v in enumerate(values, start)]

    def positions(self) -> dict:
        return dict(self.next)

    def seek(self, offsets: dict) -> None:
        self.next.update(offsets)

    def commit(self, positions=None) -> None:
        self.calls += 1
        if self.calls % self.every == 0:
            self.broker.committed = dict(positions or self.next)

    def commit_now(self, positions=None) -> None:
        self.broker.committed = dict(positions or self.next)

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def close(self) -> None: ...


class Killed(BaseException):
    """The process dies here: no handler of the service runs (like SIGKILL)."""


class CrashingSink(MemorySink):
    """Dies (like SIGKILL) when asked to publish its ``after``-th message."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def publish(self, key, message) -> None:
        if len(self.messages) >= self.after:
            raise Killed()
        super().publish(key, message)


def config(tmp_path: Path, checkpoint: bool = True, every_records: int = EVERY, **privacy):
    runtime = {"poll_max_records": 500, "publish_interval_s": 0, "on_halt": "exit"}
    if checkpoint:
        runtime["checkpoint_path"] = str(tmp_path / "ckpt.npz")
    return config_from_dict({
        "model": {"family": "linreg", "params": {"dim": 5}},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "accounting": "window",
                    "ledger": {"type": "file", "path": str(tmp_path / "ledger.jsonl"), "prepay_steps": 1}, **privacy},
        "sampling": {"reservoir": M, "batch_size": 100, "reservoir_policy": "window"},
        "schedule": {"every_records": every_records},
        "metrics": {"enabled": False},
        "runtime": runtime,
        "sink": {"type": "jsonl", "path": str(tmp_path / "models.jsonl")},
        "dead_letter": {"type": "jsonl", "path": str(tmp_path / "dead.jsonl")},
    }, env={})


def ledger_lines(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()[1:]]


def test_a_crash_and_a_checkpoint_restart_keep_every_record_within_l_steps(tmp_path):
    """One partition, checkpoint configured: life 1 commits (and checkpoints) rarely and dies
    while publishing; life 2 restores the checkpoint and re-reads the records after it at the
    same positions. Counting each record's steps from the ledger's positions over both lives,
    no record is in more than L steps, and the re-read positions were skipped, not paid again."""
    broker = Broker()
    first = Application.from_config(config(tmp_path), source=AtLeastOnceSource(broker, every=3),
                                    sink=CrashingSink(8), dead_letter=MemoryDeadLetterSink())
    with pytest.raises(Killed):
        first.run()
    paid = ledger_lines(tmp_path)
    second = Application.from_config(config(tmp_path), source=AtLeastOnceSource(broker),
                                     sink=MemorySink(), dead_letter=MemoryDeadLetterSink())
    assert second.learner.window_steps == L and second.reservoir.seen < paid[-1]["at"]  # a real replay
    stats = second.run()
    lines = ledger_lines(tmp_path)
    assert lines[:len(paid)] == paid and len(lines) > len(paid) and stats.skipped_steps >= 1
    steps_of = np.zeros(len(RECORDS), dtype=int)  # the checkpoint restores positions: one scale
    for line in lines:
        steps_of[max(0, line["at"] - M):line["at"]] += 1
    assert steps_of.max() == L  # full windows are reached, and never exceeded


def test_window_accounting_in_a_service_needs_a_checkpoint(tmp_path):
    """Without one, a restart re-reads the records after the last commit at new positions: they
    were in the previous life's last steps and enter the new life's first ones."""
    with pytest.raises(ConfigError, match=r"^privacy\.accounting: window accounting in a service needs "
                                          r"runtime\.checkpoint_path"):
        Application.from_config(config(tmp_path, checkpoint=False), source=AtLeastOnceSource(Broker()))
    with FileLedger(tmp_path / "ledger.jsonl") as ledger:  # the refused start released its lock
        assert ledger.events() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.jsonl"]  # no sink or dead-letter file made


def test_a_source_of_two_partitions_is_refused_before_any_step(tmp_path):
    """Two partitions re-read in another interleaving put a record at a later position after a
    restart, past the window's bound; refused at the first poll, nothing applied or spent."""
    broker = Broker(partitions=2)
    source = AtLeastOnceSource(broker, order=lambda i: i % 2)
    app = Application.from_config(config(tmp_path), source=source, sink=MemorySink(),
                                  dead_letter=MemoryDeadLetterSink())
    with pytest.raises(ConfigError, match=r"^privacy\.accounting: window accounting needs a source of one "
                                          r"partition, this one reads 2"):
        app.run()
    assert ledger_lines(tmp_path) == [] and app.reservoir.seen == 0
    assert broker.committed == {("t", 0): 0, ("t", 1): 0}


def test_a_lost_checkpoint_with_a_paid_ledger_is_refused_before_spending(tmp_path):
    """The ledger holds steps but the checkpoint is gone: this life's positions are unknown, so
    records read again could be in more than L steps. The start is refused: nothing read,
    appended to the ledger or committed."""
    broker = Broker()
    app = Application.from_config(config(tmp_path), source=AtLeastOnceSource(broker, every=3),
                                  sink=CrashingSink(5), dead_letter=MemoryDeadLetterSink())
    with pytest.raises(Killed):
        app.run()
    paid, committed = ledger_lines(tmp_path), dict(broker.committed)
    (tmp_path / "ckpt.npz").unlink()
    with pytest.raises(LedgerMismatch, match="no checkpoint restored this learner's stream position"):
        Application.from_config(config(tmp_path), source=AtLeastOnceSource(broker), sink=MemorySink(),
                                dead_letter=MemoryDeadLetterSink())
    assert ledger_lines(tmp_path) == paid and broker.committed == committed
    with FileLedger(tmp_path / "ledger.jsonl"):  # the refused start released its lock
        pass


def _monitor(path: Path, window: int | None) -> BudgetMonitor:
    ledger = FileLedger(path)
    try:
        return BudgetMonitor(1.0, 1e-5, make_accountant("pld", "poisson"), ledger, window=window)
    except BaseException:
        ledger.close()
        raise


EVENT = SubsampledGaussianEvent(4.0, 0.1, "poisson")


def test_a_ledger_paid_under_stream_accounting_is_refused_by_window_accounting(tmp_path):
    """Stream accounting's records could be in every step: windows of L would lower the epsilon."""
    path = tmp_path / "ledger.jsonl"
    stream = _monitor(path, None)
    while stream.admit(EVENT) is not None:
        pass
    spent = stream.spent()
    stream.ledger.close()
    with pytest.raises(LedgerMismatch, match=r"taken under stream accounting .* privacy\.accounting is window"):
        _monitor(path, 4)
    reopened = _monitor(path, None)  # the same ledger under stream accounting: nothing lowered
    assert reopened.spent() == spent
    reopened.ledger.close()


def test_a_shorter_window_is_refused_and_a_longer_one_only_over_counts(tmp_path):
    path = tmp_path / "ledger.jsonl"
    first = _monitor(path, 10)
    for _ in range(15):
        assert first.admit(EVENT) is not None
    spent = first.spent()
    first.ledger.close()
    assert '"window":10' in path.read_text().splitlines()[1]  # each step carries its window
    with pytest.raises(LedgerMismatch, match="window of 10 steps, but this configuration's window is 2"):
        _monitor(path, 2)
    longer = _monitor(path, 12)
    assert longer.spent() >= spent
    longer.ledger.close()


def test_a_notebook_learner_on_a_paid_window_ledger_must_restore_its_state_first(tmp_path):
    """PrivateLearner with a durable ledger: feeding the same records again in a new process
    would put them in more than L steps, unless the saved state is restored."""
    X = RNG.uniform(-0.5, 0.5, size=(3000, 2))
    y = X @ np.array([0.8, -0.4])
    opts = dict(dim=2, epsilon=5.0, reservoir=1000, batch_size=100, every_records=250, accounting="window",
                reservoir_policy="window", ledger_path=tmp_path / "ledger.jsonl")
    with PrivateLearner("linreg", **opts) as first:
        first.learn_many((X, y))
        state, steps = first.state(), first.engine.monitor.steps
    assert steps > 0
    with PrivateLearner("linreg", **opts) as again:
        with pytest.raises(LedgerMismatch, match="no checkpoint restored"):
            again.learn_many((X, y))
        assert again.engine.monitor.steps == steps
    with PrivateLearner("linreg", **opts) as restored:
        restored.load_state(state)
        restored.learn_many((X[:600], y[:600]))  # new records after the restored position
        assert restored.engine.monitor.steps > steps


def test_a_step_called_by_hand_sooner_than_every_records_is_refused_with_nothing_spent(tmp_path):
    """The window's L = ceil(M / k) steps per record needs steps k arrivals apart; the trigger
    keeps that, but step() is public: forty calls at one position used to be admitted with
    epsilon_spent still under the budget while the last records were in all of them."""
    X = RNG.uniform(-0.5, 0.5, size=(200, 2))
    y = X @ np.array([0.8, -0.4])
    opts = dict(dim=2, epsilon=1.0, reservoir=100, batch_size=10, every_records=50, accounting="window",
                reservoir_policy="window", ledger_path=tmp_path / "ledger.jsonl", seed=1)
    with PrivateLearner("linreg", **opts) as learner:
        learner.learn_many((X[:100], y[:100]))  # fills the window: one step at position 100
        assert learner.engine.monitor.steps == 1
        for _ in range(3):
            with pytest.raises(StepRefused, match="every_records = 50 arrivals after the last one"):
                learner.step()
        assert learner.engine.monitor.steps == 1
        learner.learn_many((X[100:149], y[100:149]))
        with pytest.raises(StepRefused):
            learner.step()
        learner.learn_many((X[149:150], y[149:150]))  # the trigger's own step at 150
        assert learner.engine.monitor.steps == 2
        state = learner.state()
    with PrivateLearner("linreg", **opts) as restarted:  # the spacing survives a restart
        restarted.load_state(state)
        with pytest.raises(StepRefused):
            restarted.step()
        assert restarted.engine.monitor.steps == 2
        restarted.learn_many((X[150:200], y[150:200]))
        assert restarted.engine.monitor.steps == 3
    positions = [line["at"] for line in ledger_lines(tmp_path)]
    assert positions == [100, 150, 200]


def test_held_steps_and_prepaid_positions_keep_every_record_within_l_steps_through_a_restart(tmp_path):
    """Positions paid ahead (prepay) and a step held back (a failing publish) and taken late:
    the late step must be recorded where it ran, not at its planned position, or a restart from
    an older checkpoint steps again too soon after it (a record then was in L + 1 steps). After
    the restart the trigger's grid is shifted against the ledger: a step that comes too soon is
    skipped like a replayed one (raising there stopped every restart at the same place). Counted
    from the positions of the steps really taken, no record is in more than L steps."""
    from stream_vips.core.data.decoding import decode_batch

    M_, k = 100, 10
    cfg = config_from_dict({
        "model": {"family": "linreg", "params": {"dim": 5}},
        "privacy": {"epsilon": 5.0, "delta": 1e-5, "accounting": "window", "seed": 1,
                    "ledger": {"type": "file", "path": str(tmp_path / "ledger.jsonl"), "prepay_steps": 4}},
        "sampling": {"reservoir": M_, "batch_size": 10, "reservoir_policy": "window"},
        "schedule": {"every_records": k}, "metrics": {"enabled": False}, "runtime": {"on_halt": "exit"},
    }, env={})
    taken: list[int] = []
    pos = 0

    def feed(learner, n, stop=lambda: False):
        nonlocal pos
        learner.offer(decode_batch(learner.model, RECORDS[pos:pos + n]), stop=stop,
                      on_step=lambda result: taken.append(learner.reservoir.seen))
        pos += n

    first = PrivateLearner.from_config(cfg)
    feed(first, 100)  # a step at 100, paying ahead for 110, 120 and 130
    feed(first, 10)
    feed(first, 2)
    state, checkpoint = first.state(), pos  # the checkpoint at 112
    feed(first, 8, stop=lambda: True)  # the step due at 120 is held back
    feed(first, 5)  # ... and taken at the next arrival, 121
    feed(first, 10)  # and the next at 131
    first.close()  # killed: no newer checkpoint
    assert taken == [100, 110, 121, 131]
    again = PrivateLearner.from_config(cfg)
    again.load_state(state)
    pos = checkpoint
    for _ in range(20):
        feed(again, 10)
    again.close()
    assert again.skipped_steps >= 1 and len(taken) > 4
    in_steps = np.zeros(pos, dtype=int)
    for seen in taken:  # a window reservoir at position s holds arrivals s - M .. s - 1
        in_steps[max(0, seen - M_):seen] += 1
    assert in_steps.max() <= -(-M_ // k)
