"""What an operator sees and how a run ends: a spent ledger halts a restart at once, a halt on
rejected data exits 8 (the budget's halt 0), the halt's cause is a metric, a source that holds no
partition or misses a topic is warned of and exported, and progress shows the current rate."""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from connectors.kafka import source as source_module
from connectors.kafka.source import KafkaSource
from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
from connectors.synthetic import SyntheticRegressionSource
from stream_vips.cli import main
from stream_vips.cli.console import Progress
from stream_vips.io import Coverage
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict

DIM = 3


def cfg(tmp_path: Path, **over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": {"family": "linreg", "params": {"dim": DIM, "y_bound": 2.0}},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "noise_multiplier": 6.0, "seed": 7,
                    "ledger": {"type": "file", "path": str(tmp_path / "ledger.jsonl")}},
        "sampling": {"method": "fixed", "reservoir": 200, "batch_size": 50},
        "schedule": {"every_records": 100, "tau0": 1.0},
        "sink": {"type": "jsonl", "path": str(tmp_path / "models.jsonl")},
        "dead_letter": {"type": "jsonl", "path": str(tmp_path / "dead.jsonl")},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 500, "poll_timeout_s": 0.01, "publish_interval_s": 0.0},
    }
    for name, value in over.items():
        data[name] = {**data.get(name, {}), **value}
    return data


def lines(n: int, malformed: float = 0.0, seed: int = 1) -> list[bytes]:
    return SyntheticRegressionSource(count=n, dimension=DIM, seed=seed, malformed_fraction=malformed).generate(n)


def test_a_restart_on_a_spent_ledger_halts_at_once(tmp_path):
    """With ``on_halt: exit`` and no new records, a restart whose ledger has no room for another
    step used to wait for records for ever; it now halts before consuming, and says why."""
    first = Application.from_config(config_from_dict(cfg(tmp_path), env={}), source=MemorySource(lines(20_000)))
    stats = first.run()
    assert stats.halted and stats.halt_cause == "budget" and stats.updates >= 2
    open_source = MemorySource(finite=False)  # no record will ever come
    second = Application.from_config(config_from_dict(cfg(tmp_path), env={}), source=open_source)
    started = time.monotonic()
    again = second.run()
    assert time.monotonic() - started < 10
    assert again.halted and again.halt_cause == "budget" and again.updates == 0
    assert "leave no room for another" in again.halt_reason
    assert second.metrics.halt_cause.labels(cause="budget")._value.get() == 1


def test_a_ledger_with_room_does_not_halt_at_start(tmp_path):
    """The start-up check halts only a ledger that cannot take one more step."""
    app = Application.from_config(config_from_dict(cfg(tmp_path), env={}), source=MemorySource(lines(250)))
    stats = app.run()
    assert not stats.halted and stats.updates == 1


def write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(data))
    return path


def test_a_halt_on_rejected_data_exits_8_and_a_spent_budget_exits_0(tmp_path, capsys):
    records = tmp_path / "records.jsonl"
    records.write_bytes(b"\n".join(lines(5_000, malformed=0.8)) + b"\n")
    data = cfg(tmp_path, source={"type": "jsonl", "path": str(records)})
    summary = tmp_path / "summary.json"
    code = main(["run", "--config", str(write_config(tmp_path, data)), "--no-progress", "--json-summary", str(summary)])
    err = capsys.readouterr().err
    assert code == 8, err
    assert "halted on rejected data" in err and "sampling.max_rejected_fraction" in err
    assert json.loads(summary.read_text())["halt_cause"] == "rejected_data"

    records.write_bytes(b"\n".join(lines(20_000)) + b"\n")
    data = cfg(tmp_path / "", source={"type": "jsonl", "path": str(records)},
               privacy={"ledger": {"type": "file", "path": str(tmp_path / "ledger2.jsonl")}})
    code = main(["run", "--config", str(write_config(tmp_path, data)), "--no-progress", "--json-summary", str(summary)])
    assert code == 0 and json.loads(summary.read_text())["halt_cause"] == "budget"


class Partitioned(MemorySource):
    """A memory source that reports a scripted coverage at each check."""

    def __init__(self, covers: list[Coverage]) -> None:
        super().__init__(finite=False)
        self.covers = covers
        self.checks = 0

    def coverage(self) -> Coverage:
        self.checks += 1
        return self.covers[min(self.checks, len(self.covers)) - 1]


def test_a_missing_topic_is_warned_of_at_start_and_no_partition_from_the_second_check(tmp_path, caplog):
    covers = [Coverage(held=0, partitions=0, topics=("events",), missing=("events",)),
              Coverage(held=0, partitions=2, topics=("events",)),
              Coverage(held=0, partitions=2, topics=("events",)),
              Coverage(held=2, partitions=2, topics=("events",))]
    source = Partitioned(covers)
    data = cfg(tmp_path, runtime={"source_check_s": 0.05, "on_halt": "exit"})
    app = Application.from_config(config_from_dict(data, env={}), source=source, sink=MemorySink(),
                                  dead_letter=MemoryDeadLetterSink())
    with caplog.at_level(logging.WARNING, logger="stream_vips.service.app"):
        app._check_source()  # at start
        assert app.metrics.source_topic_missing.labels(topic="events")._value.get() == 1
        assert app.metrics.source_partitions._value.get() == 0
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1
        assert "'events' does not exist" in warned[0] and "streamvipsinputtopicmissing" in warned[0]
        app._check_source()  # within the interval: no new check
        assert source.checks == 1
        for _ in range(3):
            time.sleep(0.06)
            app._check_source()
    warned = [r.getMessage() for r in caplog.records]
    assert source.checks == 4
    assert sum("holds none of the 2 partitions" in w for w in warned) == 2  # checks 2 and 3, not 4
    assert app.metrics.source_topic_missing.labels(topic="events")._value.get() == 0
    assert app.metrics.source_partitions._value.get() == 2
    app.learner.close()


def test_no_partition_at_the_first_check_is_not_yet_a_problem(tmp_path, caplog):
    source = Partitioned([Coverage(held=0, partitions=2, topics=("events",))])
    app = Application.from_config(config_from_dict(cfg(tmp_path), env={}), source=source, sink=MemorySink(),
                                  dead_letter=MemoryDeadLetterSink())
    with caplog.at_level(logging.WARNING, logger="stream_vips.service.app"):
        app._check_source()
    assert not caplog.records  # joining the group takes a moment
    app.learner.close()


class Assigner:
    """A consumer client whose assignment and topic metadata the test sets."""

    offset_of = staticmethod(lambda r: r.offset)
    value_of = staticmethod(lambda r: r.value)

    def __init__(self) -> None:
        self.raw = None
        self.held: set = set()
        self.counts: dict[str, int] = {}
        self.rejoins = 0

    def subscribe(self, topics: list[str], hooks: Any) -> None: ...

    def fetch(self, max_records: int, timeout_s: float) -> list:
        return []

    def assignment(self) -> set:
        return set(self.held)

    def partition_counts(self, topics: list[str]) -> dict[str, int]:
        return {t: self.counts.get(t, 0) for t in topics}

    def rejoin(self) -> None:
        self.rejoins += 1

    def pause(self, tps: Any) -> None: ...

    def resume(self, tps: Any) -> None: ...

    def paused(self) -> set:
        return set()

    def commit(self, offsets: Any, timeout_s: float) -> None: ...

    def close(self) -> None: ...


def test_a_member_holding_nothing_of_existing_partitions_asks_to_be_assigned_again(monkeypatch):
    """The stale static membership found on a real broker: a restarted static member is handed
    the empty assignment made while its topic was missing, and kafka-python never recomputes it."""
    client = Assigner()
    monkeypatch.setattr(source_module, "consumer_client", lambda *args: client)
    monkeypatch.setattr(source_module, "check_access", lambda *args, **kw: None)  # no broker to ask
    source = KafkaSource(topics="events", bootstrap_servers="127.0.0.1:1")
    try:
        assert source.coverage().missing == ("events",) and client.rejoins == 0  # missing: nothing to assign
        client.counts["events"] = 3
        assert source.coverage() == Coverage(held=0, partitions=3, topics=("events",))
        assert client.rejoins == 0  # the first check that sees the partitions: the group may still be joining
        source.coverage()
        assert client.rejoins == 1
        client.held = {("events", 0), ("events", 1), ("events", 2)}
        assert source.coverage().problem() is None
        source.coverage()
        assert client.rejoins == 1
    finally:
        source.close()


def test_progress_shows_the_rate_since_the_last_line(tmp_path):
    app = Application.from_config(config_from_dict(cfg(tmp_path), env={}), source=MemorySource(lines(10)),
                                  sink=MemorySink(), dead_letter=MemoryDeadLetterSink())
    progress = Progress(io.StringIO(), every_s=0.0)
    app.stats.records = 1000
    time.sleep(0.05)
    busy = progress.line(app)
    time.sleep(0.05)
    idle = progress.line(app)  # no record since the last line
    assert " 0/s" in idle and " 0/s" not in busy
    app.learner.close()


def test_a_failed_start_closes_the_connectors_it_built(tmp_path, monkeypatch):
    """A Kafka source left open after a refused start stays a group member until its session
    times out and holds up the next start: every connector built is closed again."""
    import stream_vips.service.build as build
    from stream_vips.config import ConfigError

    closed: list[str] = []
    real = build.connector

    def recording(kind: str, cfg: Any) -> Any:
        connector = real(kind, cfg)
        close = connector.close
        connector.close = lambda: (closed.append(kind), close())[1]  # type: ignore[method-assign]
        return connector

    monkeypatch.setattr(build, "connector", recording)
    records = tmp_path / "records.jsonl"
    records.write_bytes(b"\n".join(lines(10)) + b"\n")
    (tmp_path / "ckpt").mkdir()
    data = cfg(tmp_path, source={"type": "jsonl", "path": str(records)},
               runtime={"checkpoint_path": str(tmp_path / "ckpt")})  # a directory: refused after the connectors
    with pytest.raises(ConfigError, match="runtime.checkpoint_path"):
        Application.from_config(config_from_dict(data, env={}))
    assert sorted(closed) == ["dead_letter", "sink", "source"]
