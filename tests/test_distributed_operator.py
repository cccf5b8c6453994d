"""The operator's side of the sharded service (``stream-vips run`` with ``runtime.shards: 2``):
per-shard counts in the progress lines, the summary and the metrics, the phases of a step timed,
the exit codes and SIGTERM of the one-process service, and ``stream-vips plan`` on shards.

The shards read one jsonl file each (``records.shard<i>.jsonl``), so none of this needs a broker;
tests/test_kafka_shards.py runs the command on Kafka partitions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_vips.cli import main, sharded
from stream_vips.cli.plan import plan
from stream_vips.distributed import PHASES, LocalPool, ShardedLearner
from stream_vips.service import build
from stream_vips.service.build import config_from_dict
from test_distributed import records

REPO = Path(__file__).resolve().parents[1]


def write_shards(tmp_path: Path, per_shard: list[int], malformed: list[int] | None = None, seed: int = 0) -> None:
    """``records.shard<i>.jsonl`` with ``per_shard[i]`` lines, the first ``malformed[i]`` not JSON."""
    malformed = malformed or [0] * len(per_shard)
    for i, (n, bad) in enumerate(zip(per_shard, malformed)):
        good = [json.dumps(r) for r in records(n - bad, seed=seed + i)]
        (tmp_path / f"records.shard{i}.jsonl").write_text("\n".join(["{not json"] * bad + good) + "\n")


def settings(tmp_path: Path, **over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": {"family": "linreg", "params": {"dim": 2}},
        "source": {"type": "jsonl", "path": str(tmp_path / "records.jsonl")},
        "sink": {"type": "jsonl", "path": str(tmp_path / "models.jsonl")},
        "dead_letter": {"type": "jsonl", "path": str(tmp_path / "dead.jsonl")},
        "sampling": {"reservoir": 60, "batch_size": 12},
        "schedule": {"every_records": 30},
        "privacy": {"epsilon": 3.0, "seed": 5, "planned_steps": 8,
                    "ledger": {"type": "file", "path": str(tmp_path / "ledger.jsonl")}},
        "metrics": {"enabled": False},
        "runtime": {"shards": 2, "poll_max_records": 10, "poll_timeout_s": 0.01, "publish_interval_s": 0,
                    "on_halt": "exit"},
    }
    for section, values in over.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"  # JSON is YAML
    path.write_text(json.dumps(data))
    return path


def ledger_steps(tmp_path: Path) -> int:
    from stream_vips.privacy.ledger import FileLedger

    if not (tmp_path / "ledger.jsonl").exists():
        return 0
    ledger = FileLedger(str(tmp_path / "ledger.jsonl"))
    try:
        return len(ledger.events())
    finally:
        ledger.close()


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- progress and summary --------------------------------------------------------------------


def test_summary_and_progress_show_each_shards_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_shards(tmp_path, [100, 80], malformed=[3, 5])
    summary_path = tmp_path / "summary.json"
    code = main(["run", "--config", str(write_config(tmp_path, settings(tmp_path))),
                 "--json-summary", str(summary_path)])
    err = capsys.readouterr().err
    assert code == 0, err
    s = json.loads(summary_path.read_text())
    assert [(r["shard"], r["records"], r["accepted"], r["rejected"], r["dead_letters"]) for r in s["shards"]] == [
        (0, 100, 97, 3, 3), (1, 80, 75, 5, 5)]
    assert [(r["reservoir"], r["capacity"], r["fill"]) for r in s["shards"]] == [(30, 30, 1.0), (30, 30, 1.0)]
    assert s["records"] == 180 and s["records_rejected"] == 8 and s["rejected_by_reason"] == {"invalid_json": 8}
    # every dead letter is in its shard's own file
    assert [len(lines_of(tmp_path / f"dead.shard{i}.jsonl")) for i in range(2)] == [3, 5]
    # one ledger, versions 0.. published once each, the summary's updates are the ledger's steps
    models = lines_of(tmp_path / "models.jsonl")
    assert s["updates"] >= 2 and s["last_version"] == s["updates"] - 1
    assert [m["version"] for m in models] == list(range(s["updates"])) and s["published"] == s["updates"]
    assert ledger_steps(tmp_path) == s["updates"]
    assert s["epsilon_spent"] == pytest.approx(models[-1]["privacy"]["epsilon_spent"])
    assert "progress: " in err and "shard 0: " in err and "shard 1: " in err
    assert "shard 1: 80 records, 75 accepted, slice 30/30, 5 dead letters" in err  # the closing summary


def test_no_update_says_which_slices_are_not_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_shards(tmp_path, [40, 20])  # shard 1's slice (30) never fills
    summary_path = tmp_path / "summary.json"
    code = main(["run", "--config", str(write_config(tmp_path, settings(tmp_path))), "--no-progress",
                 "--json-summary", str(summary_path)])
    assert code == 0
    s = json.loads(summary_path.read_text())
    assert s["updates"] == 0 and s["shards"][1]["reservoir"] == 20
    assert s["shards"][1]["fill"] == pytest.approx(2 / 3, abs=1e-4)
    assert "hold 50 of 60 records" in s["no_update_because"]
    assert not (tmp_path / "models.jsonl").exists() or lines_of(tmp_path / "models.jsonl") == []


# -- metrics ---------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_carry_per_shard_series_and_step_phases(tmp_path: Path) -> None:
    write_shards(tmp_path, [100, 80], malformed=[3, 5])
    data = settings(tmp_path, metrics={"enabled": True, "host": "127.0.0.1", "port": 0})
    service = sharded.start(config_from_dict(data, env={}))
    try:
        sharded.serve(service)
    finally:
        service.close()
    got = samples(service.metrics.exposition().decode())
    for shard, (read, accepted, dead) in enumerate([(100, 97, 3), (80, 75, 5)]):
        label = (("shard", str(shard)),)
        assert got[("stream_vips_shard_records_total", label)] == read
        assert got[("stream_vips_shard_records_accepted_total", label)] == accepted
        assert got[("stream_vips_shard_dead_letters_total", label)] == dead
        assert got[("stream_vips_shard_reservoir_records", label)] == 30
        assert got[("stream_vips_shard_reservoir_capacity", label)] == 30
    steps = service.learner.steps_taken
    assert steps >= 2
    for phase in PHASES:  # one observation per phase per released step
        assert got[("stream_vips_step_phase_duration_seconds_count", (("phase", phase),))] == steps
    assert got[("stream_vips_updates_total", ())] == steps
    assert got[("stream_vips_update_duration_seconds_count", ())] == steps
    assert got[("stream_vips_records_consumed_total", ())] == 180
    assert got[("stream_vips_records_rejected_total", (("reason", "invalid_json"),))] == 8
    assert got[("stream_vips_reservoir_capacity", ())] == 60 and got[("stream_vips_reservoir_records", ())] == 60
    assert got[("stream_vips_epsilon_spent", ())] == pytest.approx(service.learner.epsilon_spent)
    assert got[("stream_vips_model_version", ())] == steps - 1
    assert service.metrics_port not in (None, 0)


def test_a_restarted_shards_lower_counts_are_a_new_baseline_not_a_negative_increment() -> None:
    from stream_vips.service.metrics import Metrics, ShardSeries

    m = Metrics()
    series = ShardSeries(m)
    series.observe_shard(0, 50, 45, 5, 30, 30, {"invalid_json": 5})
    series.observe_shard(0, 20, 20, 0, 20, 30, {})  # restarted: counts from zero again
    series.observe_shard(0, 30, 29, 1, 30, 30, {"invalid_json": 1})
    got = samples(m.exposition().decode())
    assert got[("stream_vips_shard_records_total", (("shard", "0"),))] == 60
    assert got[("stream_vips_shard_dead_letters_total", (("shard", "0"),))] == 6
    assert got[("stream_vips_records_rejected_total", (("reason", "invalid_json"),))] == 6


def test_abandoned_steps_are_counted_in_the_drivers_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard that fails every contribution abandons every step (nothing spent), and
    stream_vips_steps_abandoned_total says how many (k8s/overlays/ray alerts on it)."""
    from stream_vips.distributed.shard import Plan, Shard, ShardContribution

    class Failing(Shard):
        def contribution(self, model_state: Any, plan: Plan) -> ShardContribution:
            if self.index == 1:
                raise RuntimeError("disk gone")
            return super().contribution(model_state, plan)

    monkeypatch.setattr(sharded, "make_pool", lambda config, sources, dead_letters: LocalPool(
        config, config.runtime.shards, sources, dead_letters, shard_class=Failing))
    write_shards(tmp_path, [100, 80])
    service = sharded.start(config_from_dict(settings(tmp_path), env={}))
    try:
        sharded.serve(service)
    finally:
        service.close()
    got = samples(service.metrics.exposition().decode())
    assert service.learner.steps_taken == 0 and service.learner.abandoned_steps >= 2
    assert got[("stream_vips_steps_abandoned_total", ())] == service.learner.abandoned_steps
    assert ledger_steps(tmp_path) == 0


# -- exit codes -------------------------------------------------------------------------------


def test_a_halt_on_rejected_data_exits_8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_shards(tmp_path, [100, 100], malformed=[80, 80])
    summary_path = tmp_path / "summary.json"
    code = main(["run", "--config", str(write_config(tmp_path, settings(tmp_path))), "--no-progress",
                 "--json-summary", str(summary_path)])
    err = capsys.readouterr().err
    assert code == 8, err
    assert "halted on rejected data" in err and "sampling.max_rejected_fraction" in err
    s = json.loads(summary_path.read_text())
    assert s["halt_cause"] == "rejected_data" and s["updates"] == 0
    assert ledger_steps(tmp_path) == 0  # nothing spent


def test_a_spent_budget_exits_0_and_a_restart_on_the_spent_ledger_halts_at_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_shards(tmp_path, [600, 600])
    data = settings(tmp_path, privacy={"epsilon": 1.0, "planned_steps": 3})
    summary_path = tmp_path / "summary.json"
    argv = ["run", "--config", str(write_config(tmp_path, data)), "--no-progress", "--json-summary", str(summary_path)]
    assert main(argv) == 0
    s = json.loads(summary_path.read_text())
    assert s["halted"] and s["halt_cause"] == "budget" and s["updates"] >= 3 and s["epsilon_spent"] <= 1.0
    models = lines_of(tmp_path / "models.jsonl")
    assert models[-1]["privacy"]["halted"] and models[-1]["version"] == s["last_version"]
    started = time.monotonic()
    assert main(argv) == 0
    again = json.loads(summary_path.read_text())
    assert again["halted"] and again["halt_cause"] == "budget" and again["updates"] == 0
    assert "leave no room for another" in again["halt_reason"]
    assert time.monotonic() - started < 20
    assert lines_of(tmp_path / "models.jsonl") == models  # nothing published again: no version twice


@pytest.mark.parametrize("over, key", [
    ({"privacy": {"unit": "key"}}, "privacy.unit"),
    ({"runtime": {"checkpoint_path": "slices.npz"}}, "runtime.checkpoint_path"),
])
def test_what_a_file_split_cannot_keep_is_refused_at_start(tmp_path: Path, over: dict[str, Any], key: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    write_shards(tmp_path, [40, 40])
    code = main(["run", "--config", str(write_config(tmp_path, settings(tmp_path, **over))), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"configuration error: {key}:" in err
    assert not (tmp_path / "ledger.jsonl").exists()


def test_a_missing_shard_file_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_shards(tmp_path, [40])  # records.shard1.jsonl is missing
    code = main(["run", "--config", str(write_config(tmp_path, settings(tmp_path))), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "configuration error: source.path:" in err and "records.shard1.jsonl" in err
    assert not (tmp_path / "ledger.jsonl").exists()


@pytest.mark.parametrize("where", ["under_a_file", "a_directory"])
def test_a_dead_letter_path_that_cannot_be_opened_exits_2_naming_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str) -> None:
    """As for one process: refused at start in one line naming ``dead_letter``, not an OSError
    out of the pool's construction; no ledger is opened, and a shard that did open its file (shard
    0, when only shard 1's path is a directory) has it closed again."""
    from connectors.jsonl import JsonlDeadLetterSink

    write_shards(tmp_path, [40, 40])
    if where == "under_a_file":  # its directory cannot be made: a file holds the name
        (tmp_path / "letters").write_text("")
        path, failing = tmp_path / "letters" / "dead.jsonl", "dead.shard0.jsonl"
    else:
        path, failing = tmp_path / "dead.jsonl", "dead.shard1.jsonl"
        (tmp_path / failing).mkdir()
    opened: list[Any] = []
    real = JsonlDeadLetterSink.__init__

    def recorded(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        opened.append(self)
    monkeypatch.setattr(JsonlDeadLetterSink, "__init__", recorded)
    data = settings(tmp_path, dead_letter={"path": str(path)})
    code = main(["run", "--config", str(write_config(tmp_path, data)), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("stream-vips: configuration error: dead_letter.path: cannot "
                                                    f"open {tmp_path}"), err
    assert f"{failing}: " in err and "Traceback" not in err
    assert not (tmp_path / "ledger.jsonl").exists()
    assert len(opened) == (0 if where == "under_a_file" else 1) and all(sink._fd < 0 for sink in opened)


class RefusingDeadLetters:
    def send(self, letters: Any) -> None:
        raise OSError(28, "No space left on device")

    def flush(self) -> None: ...

    def close(self) -> None: ...


def test_an_undelivered_dead_letter_exits_4_before_anything_is_spent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    write_shards(tmp_path, [100, 100], malformed=[0, 1])
    real = build.shard_connectors

    def connectors(cfg: Any) -> Any:
        sources, _ = real(cfg)
        return sources, lambda i: RefusingDeadLetters
    monkeypatch.setattr(build, "shard_connectors", connectors)
    code = main(["run", "--config", str(write_config(tmp_path, settings(tmp_path))), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "shard 1: a dead letter was not delivered" in err
    assert ledger_steps(tmp_path) == 0  # the malformed line is shard 1's first: no step yet


class BrokerGone:
    """Shard ``fail_shard``'s source: the jsonl file's records, then from poll ``fail_at`` on the
    error a Kafka client raises once its retries are spent (``error``, raised in ``where``)."""

    polls: dict[int, int] = {}

    def __init__(self, inner: Any, index: int, fail_at: int, error: BaseException, where: str = "poll") -> None:
        self.inner, self.index, self.fail_at, self.error, self.where = inner, index, fail_at, error, where
        BrokerGone.polls[index] = 0

    def poll(self, max_records: int, timeout_s: float) -> Any:
        BrokerGone.polls[self.index] += 1
        if self.where == "poll" and BrokerGone.polls[self.index] > self.fail_at:
            raise self.error
        return self.inner.poll(max_records, timeout_s)

    def commit(self, *args: Any) -> None:
        if self.where == "commit" and BrokerGone.polls[self.index] > self.fail_at:
            raise self.error
        self.inner.commit(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def broker_gone(monkeypatch: pytest.MonkeyPatch, fail_shard: int, fail_at: int, error: BaseException,
                where: str = "poll") -> None:
    real = build.shard_connectors

    def connectors(cfg: Any) -> Any:
        sources, dead = real(cfg)

        def source(i: int) -> Any:
            if i != fail_shard:
                return sources(i)
            return lambda: BrokerGone(sources(i)(), i, fail_at, error, where)
        return source, dead
    monkeypatch.setattr(build, "shard_connectors", connectors)


@pytest.mark.parametrize("where", ["poll", "commit"])
def test_a_kafka_client_failure_in_a_shards_source_exits_5_in_one_line_and_is_not_polled_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str) -> None:
    """A Kafka client error that leaves a shard's source (its own retries spent, e.g. a commit
    retried for commit_timeout_s with the broker gone) ends the run as it ends one process: exit
    5 and one line, not a shard failure that the driver polls again for ever. Nothing is spent
    for the round it failed in, and every step paid before it is in the ledger."""
    from kafka.errors import KafkaTimeoutError

    write_shards(tmp_path, [300, 300])
    # shard 1 fails in its 7th poll (or the commit after it): slices of 30 are full by then, and
    # steps were taken, so the failure comes in the middle of a run
    broker_gone(monkeypatch, 1, 6, KafkaTimeoutError("Failed to update metadata after 60.0 secs.\n(broker gone)"),
                where)
    summary_path = tmp_path / "summary.json"
    started = time.monotonic()
    code = main(["run", "--config", str(write_config(tmp_path, settings(tmp_path))), "--no-progress",
                 "--json-summary", str(summary_path)])
    err = capsys.readouterr().err
    assert code == 5, err
    assert time.monotonic() - started < 30
    lines = [line for line in err.splitlines() if line.startswith("stream-vips: stopped")]
    assert lines == [f"stream-vips: stopped: shard 1's source failed in {where}: KafkaTimeoutError: "
                     "KafkaTimeoutError: Failed to update metadata after 60.0 secs. (broker gone) (nothing was "
                     "committed past the records applied)"], err
    assert "Traceback" not in err and "shard failed" not in err
    assert BrokerGone.polls[1] == 7  # the driver did not poll the failed source again
    models = lines_of(tmp_path / "models.jsonl")
    assert ledger_steps(tmp_path) >= 1 and [m["version"] for m in models] == list(range(len(models)))
    assert not summary_path.exists()  # stopped, as one process stops: no summary of a finished run


def test_a_refusal_from_a_shards_source_exits_7_and_another_error_is_not_called_a_connector_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kafka.errors import TopicAuthorizationFailedError

    from stream_vips.distributed import SourceFailed

    write_shards(tmp_path, [100, 100])
    broker_gone(monkeypatch, 0, 0, TopicAuthorizationFailedError({"records"}))
    code = main(["run", "--config", str(write_config(tmp_path, settings(tmp_path))), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 7, err
    assert "stopped: not authorized" in err and "'records'" in err
    assert ledger_steps(tmp_path) == 0
    # a bug in a source is not the broker: raised as one process raises it, not exit 5
    broker_gone(monkeypatch, 0, 0, ValueError("a bug"))
    with pytest.raises(SourceFailed, match="shard 0's source failed in poll: ValueError: a bug"):
        main(["run", "--config", str(write_config(tmp_path, settings(tmp_path))), "--no-progress"])


class FailingSink:
    def __init__(self) -> None:
        self.attempts = 0

    def publish(self, model_id: str, message: Any) -> None:
        self.attempts += 1
        raise OSError("the model topic is unreachable")

    def flush(self) -> None: ...

    def close(self) -> None: ...


def test_a_model_that_cannot_be_published_pauses_the_shards_and_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one-process rule: a paid step's model is owed; no shard is polled and no step starts
    until it goes out, and a run stopped with it owed ends with exit 1."""
    import threading

    write_shards(tmp_path, [300, 300])
    cfg = config_from_dict(settings(tmp_path), env={})
    sink = FailingSink()
    service = sharded.start(cfg, sink=sink)
    threading.Timer(1.5, service.learner.stop).start()
    from argparse import Namespace

    from stream_vips.cli.run import run_sharded

    code = run_sharded(service, Namespace(no_progress=True, json_summary=None), cfg, lambda line: print(line,
                       file=sys.stderr), time.monotonic())
    err = capsys.readouterr().err
    assert code == 1, err
    assert "publishing model version 0 failed" in err
    assert service.learner.steps_taken == 1  # paused after the first paid step
    assert ledger_steps(tmp_path) == 1
    assert sum(s.seen for s in service.learner.slices.statuses if s is not None) < 600  # input paused
    assert 2 <= sink.attempts <= 4  # retried after 1 s (backoff), and once more when stopped
    # every failed attempt while it ran is counted (the last one, on the way out, ends the process)
    got = samples(service.metrics.exposition().decode())
    assert got[("stream_vips_publish_failures_total", ())] == sink.attempts - 1


class FlakySink(FailingSink):
    """Fails its first ``failures`` publishes, then takes every message."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.messages: list[Any] = []

    def publish(self, model_id: str, message: Any) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise OSError("the model topic is unreachable")
        self.messages.append(message)


def test_publish_failures_are_counted_in_the_drivers_metrics_and_the_run_resumes(tmp_path: Path) -> None:
    """stream_vips_publish_failures_total (the base's StreamVipsPublishFailures alert) counts the
    sharded driver's failed publishes as it does one process's; the run goes on once one is out."""
    write_shards(tmp_path, [300, 300])
    cfg = config_from_dict(settings(tmp_path, metrics={"enabled": True, "host": "127.0.0.1", "port": 0}), env={})
    sink = FlakySink(failures=1)
    service = sharded.start(cfg, sink=sink)
    try:
        sharded.serve(service)
    finally:
        service.close()
    got = samples(service.metrics.exposition().decode())
    assert got[("stream_vips_publish_failures_total", ())] == 1
    assert service.learner.steps_taken >= 2 and sink.messages
    versions = [m["version"] for m in sink.messages]
    assert versions[0] == 0 and versions == sorted(versions)  # the owed version 0 first, then on


def test_sigterm_finishes_the_round_publishes_and_exits_0(tmp_path: Path) -> None:
    write_shards(tmp_path, [200, 200])
    # never exhausted, and a budget the records cannot spend: only a signal ends the run
    data = settings(tmp_path, source={"follow": True}, privacy={"planned_steps": 100})
    summary_path = tmp_path / "summary.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "stream_vips.cli", "run", "--config",
                             str(write_config(tmp_path, data)), "--json-summary", str(summary_path)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    models = tmp_path / "models.jsonl"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if len(lines_of(models)) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert "SIGTERM" in err.decode()
    s = json.loads(summary_path.read_text())
    assert s["stopped_by_signal"] and not s["halted"]
    published = [m["version"] for m in lines_of(models)]
    assert published == list(range(s["updates"])) and published[-1] == s["last_version"]


# -- stream-vips plan ---------------------------------------------------------------------------


def test_plan_says_epsilon_does_not_depend_on_the_shards_and_a_sharded_run_spends_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    one = plan("poisson", 12, 60, 4, 1e-5, noise_multiplier=1.5)
    three = plan("poisson", 12, 60, 4, 1e-5, noise_multiplier=1.5, shards=3)
    assert three["epsilon"] == one["epsilon"] and three["shards"] == 3 and not three["epsilon_depends_on_shards"]
    # the sharded driver's ledger spends exactly what plan printed, after the same number of steps
    cfg = config_from_dict({"model": {"family": "linreg", "params": {"dim": 2}},
                            "sampling": {"reservoir": 60, "batch_size": 12, "method": "poisson"},
                            "schedule": {"every_records": 30},
                            "privacy": {"epsilon": 100.0, "delta": 1e-5, "noise_multiplier": 1.5, "seed": 1,
                                        "accountant": one["accountant"], "ledger": {"type": "memory"}},
                            "runtime": {"shards": 3}}, env={})
    with ShardedLearner(cfg, LocalPool(cfg, 3)) as learner:
        data = records(60 + 30 * 3)
        for start in range(0, len(data), 30):
            chunk = data[start:start + 30]
            learner.feed([chunk[i::3] for i in range(3)])
        assert learner.steps_taken == 4
        assert learner.epsilon_spent == pytest.approx(three["epsilon"], rel=1e-9)
    assert main(["plan", "--sampling", "poisson", "--batch-size", "12", "--reservoir", "60", "--steps", "4",
                 "--delta", "1e-5", "--noise-multiplier", "1.5", "--shards", "3"]) == 0
    assert "epsilon does not depend on the number of shards" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--shards 61 exceeds --reservoir 60"):
        plan("poisson", 12, 60, 4, 1e-5, noise_multiplier=1.5, shards=61)
