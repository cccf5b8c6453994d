"""Restart strategy (issue 6 item 5) without a broker: the checkpointed reservoir plus the offsets it
reflects continue exactly like an uninterrupted run; the file is private and written atomically."""

from __future__ import annotations

import numpy as np
import pytest

from connectors.memory import MemoryDeadLetterSink, MemorySink
from kafka_broker import linreg_records
from stream_vips.io import RawRecord
from stream_vips.privacy.ledger import MemoryLedger
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict
from stream_vips.service.checkpoint import Checkpoint, CheckpointError, attach


class OffsetSource:
    """A one-partition in-memory source with Kafka-like positions() and seek() (test double)."""

    def __init__(self, values: list[bytes], stop_at: int | None = None) -> None:
        self.values, self.pos, self.stop_at = values, 0, stop_at
        self.committed = 0

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        end = min(self.pos + max_records, len(self.values) if self.stop_at is None else self.stop_at)
        out = [RawRecord(v, {"topic": "t", "partition": 0, "offset": i})
               for i, v in enumerate(self.values[self.pos:end], start=self.pos)]
        self.pos = end
        return out

    def positions(self) -> dict[tuple[str, int], int]:
        return {("t", 0): self.pos}

    def seek(self, offsets) -> None:
        self.pos = offsets[("t", 0)]

    def commit(self, positions=None) -> None:
        self.committed = self.pos if positions is None else positions[("t", 0)]

    commit_now = commit

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    @property
    def exhausted(self) -> bool:
        return self.pos >= (len(self.values) if self.stop_at is None else self.stop_at)

    def close(self) -> None: ...


def _app(source, ledger, decode_workers: int = 0) -> Application:
    cfg = config_from_dict({
        "model": {"family": "linreg", "params": {"dim": 4}},
        "privacy": {"noise_multiplier": 2.0, "epsilon": 5.0, "seed": 3, "ledger": {"type": "memory"}},
        "sampling": {"reservoir": 500, "batch_size": 50},
        "schedule": {"every_records": 400},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 130, "decode_workers": decode_workers},
    }, env={})
    return Application.from_config(cfg, source=source, sink=MemorySink(), dead_letter=MemoryDeadLetterSink(),
                                   ledger=ledger)


@pytest.mark.parametrize("decode_workers", [0, 1])
def test_restart_from_checkpoint_continues_exactly_like_an_uninterrupted_run(tmp_path, monkeypatch, decode_workers):
    """With the decode worker a polled batch is in flight when the source is committed: every
    checkpoint still holds exactly the records before the offsets it is saved with."""
    values = linreg_records(3000, seed=1)
    whole = _app(OffsetSource(values), MemoryLedger())
    whole.run()

    saves = []
    save = Checkpoint.save
    monkeypatch.setattr(Checkpoint, "save", lambda self, learner, offsets: (
        saves.append((dict(offsets), learner.reservoir.seen)), save(self, learner, offsets))[1])
    path = tmp_path / "state" / "ckpt.npz"
    ledger = MemoryLedger()
    first = _app(OffsetSource(values, stop_at=1700), ledger, decode_workers)
    attach(first, path)
    first.run()  # "crashes" after offset 1700: only what was committed is in the checkpoint
    assert len(saves) > 5 and all(offsets == {("t", 0): seen} for offsets, seen in saves)
    assert Checkpoint(path).load()["offsets"] == {("t", 0): 1700}
    assert (path.stat().st_mode & 0o777) == 0o600
    assert not path.with_name(path.name + ".tmp").exists()

    second = _app(OffsetSource(values), ledger, decode_workers)
    attach(second, path)
    assert second.reservoir.seen == 1700
    second.run()
    a, b = whole.reservoir.get_state(), second.reservoir.get_state()
    assert b["seen"] == a["seen"] == 3000
    assert a["rng"] == b["rng"]
    for name in a["columns"]:
        np.testing.assert_array_equal(a["columns"][name], b["columns"][name])
    # the ledger carried on across the restart: versions continue, nothing was re-numbered
    assert len(ledger.events()) == first.stats.updates + second.stats.updates


def test_checkpoint_refuses_another_family_and_sources_without_offsets(tmp_path):
    app = _app(OffsetSource(linreg_records(10)), MemoryLedger())
    ckpt = Checkpoint(tmp_path / "c.npz")
    ckpt.save(app.learner, {("t", 0): 0})
    state = ckpt.load()
    state["model_family"] = "lda"
    from stream_vips.service import checkpoint as cp
    (tmp_path / "c.npz").write_bytes(cp._pack(state))
    with pytest.raises(CheckpointError, match="family 'lda'"):
        Checkpoint(tmp_path / "c.npz").restore(app.learner)

    class NoOffsets(OffsetSource):
        positions = None

    with pytest.raises(CheckpointError, match="no positions"):
        attach(_app(NoOffsets([]), MemoryLedger()), tmp_path / "d.npz")


class Crash(RuntimeError):
    pass


def test_a_crash_loop_with_prepaid_steps_pays_for_each_stream_position_once(tmp_path):
    """A pipeline that crashes at the same record on every restart (checkpoint only at its first
    commit, prepaid ledger steps) pays nothing more after the first crash: a restart takes no
    step at a position the ledger already holds, so ledger positions strictly increase."""
    from stream_vips.privacy.ledger import FileLedger

    values = linreg_records(3000, seed=4)
    cfg = {
        "model": {"family": "linreg", "params": {"dim": 4}},
        "privacy": {"noise_multiplier": 2.0, "epsilon": 50.0, "delta": 1e-5,
                    "ledger": {"type": "file", "path": str(tmp_path / "ledger.jsonl"), "prepay_steps": 4}},
        "sampling": {"reservoir": 500, "batch_size": 50},
        "schedule": {"every_records": 100},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 130, "checkpoint_path": str(tmp_path / "c.npz"),
                    "checkpoint_interval_s": 3600.0},
    }

    def life(crash_at: int | None) -> Application:
        app = Application.from_config(config_from_dict(cfg, env={}), source=OffsetSource(values),
                                      sink=MemorySink(), dead_letter=MemoryDeadLetterSink())

        def progress(a: Application) -> None:
            if crash_at is not None and a.reservoir.seen >= crash_at:
                raise Crash("the same poison record again")

        app.progress = progress
        if crash_at is None:
            app.run()
        else:
            with pytest.raises(Crash):
                app.run()
        return app

    def ledger() -> tuple[list, list]:
        with FileLedger(tmp_path / "ledger.jsonl") as led:
            return led.events(), list(led._positions)

    first = life(crash_at=2100)
    paid, _ = ledger()
    assert first.stats.updates == 18 and len(paid) == 20  # steps at 500..2200 (crash after 2210), prepaid in fours
    for _ in range(3):
        again = life(crash_at=2100)
        assert again.stats.updates == 0 and again.stats.skipped_steps == 18  # 500..2200 replayed from the checkpoint
        assert len(ledger()[0]) == len(paid)  # the crash loop costs nothing
    final = life(crash_at=None)
    events, positions = ledger()
    assert all(b > a for a, b in zip(positions, positions[1:]))  # no position paid twice
    assert positions[0] == 500 and final.stats.updates == 6  # 2500..3000: 2200..2400 were prepaid, unused
    assert len(events) <= 26 + 3  # trigger positions 500..3000, plus at most prepay - 1 unused
