"""The run loop end to end on the embedded connectors: halting exactly at the budget, messages
consistent with the ledger and the schema, dead letters with reasons, updates at exact record
counts, loud publish failures, staying up when halted, restarts, and SIGTERM mid-run."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from prometheus_client import generate_latest

from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
from connectors.synthetic import SyntheticRegressionSource
from stream_vips import messages
from stream_vips.config import ConfigError
from stream_vips.io import RawRecord
from stream_vips.privacy.accountants import PldAccountant, RdpAccountant
from stream_vips.privacy.ledger import FileLedger
from stream_vips.service.app import Application, DeadLetterError, PublishError
from stream_vips.service.build import config_from_dict
from stream_vips.service.checkpoint import Checkpoint

REPO = Path(__file__).resolve().parents[1]
DIM = 3
DELTA = 1e-5


def cfg_dict(tmp_path: Path, **sections) -> dict:
    data = {
        "model": {"family": "linreg", "params": {"dim": DIM, "y_bound": 2.0}},
        "privacy": {"epsilon": 1.0, "delta": DELTA, "noise_multiplier": 6.0, "seed": 7,
                    "ledger": {"type": "file", "path": str(tmp_path / "ledger.jsonl")}},
        "sampling": {"method": "fixed", "reservoir": 200, "batch_size": 50},  # autodp: cheap to account
        "schedule": {"every_records": 100, "tau0": 1.0},
        "sink": {"type": "jsonl", "path": str(tmp_path / "models.jsonl")},
        "dead_letter": {"type": "jsonl", "path": str(tmp_path / "dead.jsonl")},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 500, "poll_timeout_s": 0.01, "publish_interval_s": 0.0},
    }
    for name, value in sections.items():
        data[name] = {**data.get(name, {}), **value}
    return data


def synthetic_lines(n: int, seed: int = 1, malformed: float = 0.0) -> list[bytes]:
    return SyntheticRegressionSource(count=n, dimension=DIM, seed=seed, malformed_fraction=malformed).generate(n)


def ledger_events(path: Path) -> list:
    with FileLedger(path) as ledger:
        return ledger.events()


def read_messages(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("method", ["poisson", "fixed"])
def test_halts_at_the_first_update_that_would_exceed_the_budget(tmp_path, method):
    cfg = config_from_dict(cfg_dict(tmp_path, sampling={"method": method}), env={})
    source = MemorySource(synthetic_lines(20_000))
    app = Application.from_config(cfg, source=source)
    stats = app.run()

    events = ledger_events(tmp_path / "ledger.jsonl")
    fresh = PldAccountant() if method == "poisson" else RdpAccountant()  # rebuilt from the ledger alone
    n = len(events)
    assert stats.halted and n == stats.updates >= 2
    assert not source.exhausted  # it stopped consuming: the halt, not the data, ended the run
    assert fresh.epsilon(events, DELTA) <= 1.0 < fresh.epsilon(events + events[:1], DELTA)

    msgs = read_messages(tmp_path / "models.jsonl")
    schema = messages.schema()
    for msg in msgs:
        jsonschema.validate(msg, schema)  # the shipped schema, independently of messages.py
    assert [m["version"] for m in msgs] == list(range(n)) + [n - 1]
    assert [m["privacy"]["halted"] for m in msgs] == [False] * n + [True]
    last = msgs[-1]
    assert last["natural_parameters"] == msgs[-2]["natural_parameters"]  # halting re-publishes, no new update
    assert last["privacy"]["epsilon_spent"] == pytest.approx(fresh.epsilon(events, DELTA), rel=1e-9)
    for msg in msgs[:-1]:
        v = msg["version"]
        assert msg["privacy"]["epsilon_spent"] == pytest.approx(fresh.epsilon(events[: v + 1], DELTA), rel=1e-9)
        assert msg["privacy"]["steps"] == v + 1
    assert app.metrics.registry.get_sample_value("stream_vips_halted") == 1.0
    assert app.metrics.registry.get_sample_value("stream_vips_updates_total") == n


def test_restart_replays_the_ledger_and_never_resets_spent_epsilon(tmp_path):
    cfg = config_from_dict(cfg_dict(tmp_path), env={})
    Application.from_config(cfg, source=MemorySource(synthetic_lines(5_000))).run()
    before = ledger_events(tmp_path / "ledger.jsonl")
    sink = MemorySink()
    stats = Application.from_config(cfg, source=MemorySource(synthetic_lines(5_000, seed=2)), sink=sink).run()
    assert stats.halted and stats.updates == 0 and sink.messages == []
    assert ledger_events(tmp_path / "ledger.jsonl") == before


MALFORMED = [
    (b'{"x": [0.1, 0.2', "invalid_json"),
    (b"\xff\xfe not utf-8", "invalid_json"),
    (b"   ", "empty_document"),
    (b'{"x": [NaN, 0.1, 0.1], "y": 0.5}', "non_finite"),
    (b'{"x": [1e400, 0.0, 0.0], "y": 0.0}', "non_finite"),
    (b'{"x": [0.1, 0.1], "y": 0.5}', "wrong_shape"),
    (b'{"x": [0.1, 0.1, 0.1, 0.1], "y": 0.5}', "wrong_shape"),
    (b'{"x": [1e300, 0.1, 0.1], "y": 0.5}', "out_of_range"),
    (b'{"x": [0.1, 0.1, 0.1], "y": -1e12}', "out_of_range"),
    (b'{"x": "abc", "y": 0.5}', "wrong_type"),
    (b'{"x": [0.1, "a", 0.1], "y": 0.5}', "wrong_type"),
    (b'{"x": [0.1, 0.1, 0.1], "y": "high"}', "wrong_type"),
    (b"[1, 2, 3]", "not_object"),
    (b'{"y": 1.0}', "missing_field"),
]


def test_malformed_records_go_to_dead_letters_with_reasons_and_the_run_continues(tmp_path):
    good = synthetic_lines(1_000)
    rng = np.random.default_rng(0)
    positions = sorted(rng.choice(len(good), size=len(MALFORMED) * 3, replace=False).tolist())
    stream = list(good)
    expected = {}
    for k, pos in enumerate(positions):
        value, reason = MALFORMED[k % len(MALFORMED)]
        stream.insert(pos, value)
    for i, value in enumerate(stream):
        for bad, reason in MALFORMED:
            if value == bad:
                expected[i] = reason
    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": 50.0}), env={})
    dead = MemoryDeadLetterSink()
    app = Application.from_config(cfg, source=MemorySource(stream), dead_letter=dead, sink=MemorySink())
    stats = app.run()

    got = {letter.record.origin["offset"]: letter.reason for letter in dead.letters}
    assert got == expected
    assert all(letter.detail for letter in dead.letters)
    assert all(letter.record.value == stream[letter.record.origin["offset"]] for letter in dead.letters)
    assert stats.records == len(stream) and stats.accepted == len(good)
    # The run went on through the bad records; updates come every 100 arrivals, valid or not.
    assert stats.updates == 1 + (len(stream) - 200) // 100
    counts = {reason: list(expected.values()).count(reason) for reason in set(expected.values())}
    for reason, n in counts.items():
        assert app.metrics.registry.get_sample_value("stream_vips_records_rejected_total", {"reason": reason}) == n
    assert app.metrics.registry.get_sample_value("stream_vips_records_consumed_total") == len(stream)


@pytest.mark.parametrize("budget", [3.0, 50.0])
def test_publish_interval_sends_only_the_newest_model_and_always_the_last(tmp_path, budget):
    """With a long interval the first step publishes, later ones wait; the newest one always
    goes out before halting or closing, with the epsilon of the whole ledger."""
    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": budget},
                                    runtime={"publish_interval_s": 3600.0}), env={})
    sink = MemorySink()
    stats = Application.from_config(cfg, source=MemorySource(synthetic_lines(3_000)), sink=sink).run()
    events = ledger_events(tmp_path / "ledger.jsonl")
    msgs = [m for _, m in sink.messages]
    assert stats.updates == len(events) > 2
    assert [m["version"] for m in msgs] == [0, len(events) - 1]
    assert msgs[-1]["privacy"]["halted"] == stats.halted == (budget == 3.0)
    assert msgs[-1]["privacy"]["epsilon_spent"] == pytest.approx(RdpAccountant().epsilon(events, DELTA), rel=1e-9)


def test_a_rejected_record_changes_neither_update_times_nor_other_reservoir_slots(tmp_path):
    """Rule 1 with malformed input: validity depends on the value, so neighbouring streams (one
    record valid in one, malformed in the other) must see the same positions and update times."""
    stream = synthetic_lines(1_000)
    neighbour = list(stream)
    neighbour[437] = b'{"x": [NaN, 0, 0], "y": 0}'
    runs = []
    for i, s in enumerate((stream, neighbour)):
        cfg = config_from_dict(cfg_dict(tmp_path / str(i), privacy={"epsilon": 50.0}), env={})
        sink = MemorySink()
        app = Application.from_config(cfg, source=MemorySource(s), sink=sink)
        app.run()
        runs.append((app, [m["version"] for _, m in sink.messages]))
    (a, va), (b, vb) = runs
    assert va == vb and len(va) == 9  # same updates at the same arrival positions
    assert a.reservoir.seen == b.reservoir.seen == 1_000
    differ = np.flatnonzero(np.any(a.reservoir.columns["x"] != b.reservoir.columns["x"], axis=1))
    assert differ.size <= 1 and np.sum(a.reservoir.valid != b.reservoir.valid) == differ.size


def test_jsonl_dead_letters_are_written_and_flushed(tmp_path):
    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": 50.0}), env={})
    stream = synthetic_lines(300) + [bad for bad, _ in MALFORMED]
    Application.from_config(cfg, source=MemorySource(stream)).run()
    lines = [json.loads(x) for x in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert [x["reason"] for x in lines] == [reason for _, reason in MALFORMED]
    assert lines[1]["value_base64"] and lines[0]["value"] == MALFORMED[0][0].decode()


def test_updates_happen_at_exact_record_counts_whatever_the_poll_size(tmp_path):
    stream = synthetic_lines(1_500, malformed=0.05)
    states = []
    for poll in (7, 333, 5_000):
        cfg = config_from_dict(cfg_dict(tmp_path / str(poll), privacy={"epsilon": 50.0},
                                        runtime={"poll_max_records": poll}), env={})
        sink = MemorySink()
        stats = Application.from_config(cfg, source=MemorySource(stream), sink=sink).run()
        states.append((stats.updates, [m["natural_parameters"] for _, m in sink.messages]))
    assert states[0] == states[1] == states[2]
    assert states[0][0] > 5


class FailingSink(MemorySink):
    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def publish(self, key, message):
        if len(self.messages) == self.fail_at:
            raise ConnectionError("broker unreachable")
        super().publish(key, message)


def test_a_failing_publish_pauses_steps_until_stopped_then_raises_and_closes_everything(tmp_path):
    """A model that cannot be published costs only the step already paid: the source is paused,
    no further step starts while the publish is retried, and a stop ends the run with
    ``PublishError`` (a run that died at once was restarted and paid a new step every life)."""
    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": 50.0}), env={})
    sink = FailingSink(fail_at=2)
    source = MemorySource(synthetic_lines(2_000))
    app = Application.from_config(cfg, source=source, sink=sink)
    failures = lambda: app.metrics.registry.get_sample_value("stream_vips_publish_failures_total")  # noqa: E731
    errors: list[BaseException] = []

    def run():
        try:
            app.run()
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while failures() < 3 and time.monotonic() < deadline:  # retried after 1 s and 2 s
        time.sleep(0.05)
    app.stop()
    thread.join(30)
    assert not thread.is_alive() and len(errors) == 1 and isinstance(errors[0], PublishError), errors
    assert "version 2" in str(errors[0]) and failures() >= 4  # the last try at the stop raised
    # paid steps 0-2 and the next one paid ahead with step 2 (unused); none while the publish failed
    assert len(ledger_events(tmp_path / "ledger.jsonl")) == 3 + app.engine.monitor.prepay
    assert [m["version"] for _, m in sink.messages] == [0, 1]
    assert sink.closed and source.closed


def test_a_publish_that_recovers_resumes_the_run_with_no_step_lost_or_repeated(tmp_path):
    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": 50.0}), env={})

    class FlakySink(MemorySink):
        def __init__(self) -> None:
            super().__init__()
            self.refusals = 2

        def publish(self, key, message):
            if message["version"] == 2 and self.refusals:
                self.refusals -= 1
                raise ConnectionError("broker unreachable")
            super().publish(key, message)

    sink = FlakySink()
    app = Application.from_config(cfg, source=MemorySource(synthetic_lines(2_000)), sink=sink)
    stats = app.run()
    versions = [m["version"] for _, m in sink.messages]
    assert sink.refusals == 0 and versions == list(range(stats.updates)) and stats.updates > 5
    assert len(ledger_events(tmp_path / "ledger.jsonl")) == stats.updates
    assert app.reservoir.seen == 2_000  # the paused records were read after the publish went out


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_halted_service_stays_up_serving_metrics_and_health_until_stopped(tmp_path):
    cfg = config_from_dict(cfg_dict(tmp_path, runtime={"on_halt": "stay"},
                                    metrics={"enabled": True, "host": "127.0.0.1", "port": 0}), env={})
    source = MemorySource(synthetic_lines(20_000))
    app = Application.from_config(cfg, source=source)
    thread = threading.Thread(target=app.run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not app.halted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.halted and source.paused
        time.sleep(0.3)
        assert thread.is_alive()
        base = f"http://127.0.0.1:{app.metrics_port}"
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/readyz")[0] == 200
        status, body = _get(base + "/metrics")
        assert status == 200 and "stream_vips_halted 1.0" in body
        promtool = shutil.which("promtool")
        if promtool is not None:  # the live exposition of a real run passes Prometheus' own checker
            check = subprocess.run([promtool, "check", "metrics"], input=body.encode(), capture_output=True)
            assert check.returncode == 0, check.stdout + check.stderr
        consumed = source.committed_offset
        time.sleep(0.3)
        assert source.committed_offset == consumed  # no more consumption while halted
    finally:
        app.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert read_messages(tmp_path / "models.jsonl")[-1]["privacy"]["halted"] is True


def test_time_trigger_updates_without_new_records(tmp_path):
    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": 50.0},
                                    schedule={"every_records": None, "every_seconds": 0.05}), env={})
    source = MemorySource(synthetic_lines(200), finite=False)  # fills the reservoir, then silence
    sink = MemorySink()
    app = Application.from_config(cfg, source=source, sink=sink)
    thread = threading.Thread(target=app.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(sink.messages) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        app.stop()
        thread.join(10)
    assert app.stats.records == 200 and len(sink.messages) >= 3
    assert [m["version"] for _, m in sink.messages] == list(range(len(sink.messages)))


class SeekableSource(MemorySource):
    """A memory source with Kafka-like positions()/seek(), for the checkpoint wiring."""

    def __init__(self, values, start: int = 0) -> None:
        super().__init__(list(values)[start:])
        self.start = start
        self.seeks: list[dict] = []

    def positions(self):
        return {("records", 0): self.start + self._delivered}  # next offset to fetch, like Kafka

    def seek(self, offsets):
        self.seeks.append(dict(offsets))

    def commit(self, positions=None):
        super().commit()

    commit_now = commit


def test_checkpoint_path_restores_the_reservoir_and_seeks_the_source(tmp_path):
    lines = synthetic_lines(900)
    d = cfg_dict(tmp_path, privacy={"epsilon": 50.0},
                 runtime={"checkpoint_path": str(tmp_path / "ckpt" / "state.npz")})
    first = Application.from_config(config_from_dict(d, env={}), source=SeekableSource(lines[:700]))
    first.run()
    assert (tmp_path / "ckpt" / "state.npz").exists()
    source = SeekableSource(lines, start=700)
    second = Application.from_config(config_from_dict(d, env={}), source=source)
    assert source.seeks == [{("records", 0): 700}]
    assert second.reservoir.seen == 700
    np.testing.assert_array_equal(second.reservoir.columns["x"], first.reservoir.columns["x"])
    second.ledger.close()
    with pytest.raises(ConfigError, match=r"^runtime\.checkpoint_path:"):  # a source that cannot seek
        Application.from_config(config_from_dict(d, env={}), source=MemorySource([]))


def test_error_shrinks_as_epsilon_grows(tmp_path):
    """Same data and seeds, less noise: epsilon (from the ledger) grows and the distance of the
    posterior mean from the true weights shrinks. With S = 500 the noise on the mean statistics has
    std z * C / S per entry (C = sqrt(R^4 + R^2 B^2) = sqrt(5)): 0.18 at z = 40, against the
    signal E[x x^T] = 0.083 I, and 25x less at z = 1.6, where the error is near the non-private
    one. Averaging 3 seeds keeps the comparison away from single-seed luck."""
    errors, epsilons = {}, {}
    for z in (40.0, 8.0, 1.6):
        errs = []
        for seed in range(3):
            d = cfg_dict(tmp_path / f"{z}-{seed}",
                         privacy={"epsilon": 1000.0, "noise_multiplier": z, "seed": seed, "ledger": {"type": "memory"}},
                         sampling={"reservoir": 1_000, "batch_size": 500}, schedule={"every_records": 200})
            source = SyntheticRegressionSource(count=4_000, dimension=DIM, seed=100 + seed, x_scale=0.5)
            app = Application.from_config(config_from_dict(d, env={}), source=source, sink=MemorySink(),
                                          dead_letter=MemoryDeadLetterSink())
            stats = app.run()
            assert stats.updates == 16 and not stats.halted
            errs.append(np.linalg.norm(app.model.posterior_mean() - source.weights))
            epsilons[z] = app.engine.epsilon_spent()
        errors[z] = float(np.mean(errs))
    assert epsilons[40.0] < epsilons[8.0] < epsilons[1.6]
    assert errors[40.0] > 1.5 * errors[8.0] > 1.5 * 1.5 * errors[1.6], errors


def test_sigterm_mid_run_exits_cleanly_with_ledger_and_sink_consistent(tmp_path):
    config = cfg_dict(
        tmp_path,
        privacy={"epsilon": 1000.0, "noise_multiplier": 2.0},
        sampling={"method": "fixed", "reservoir": 500, "batch_size": 50},
        schedule={"every_records": 200},
        source={"type": "synthetic", "count": None, "dimension": DIM, "records_per_second": 20_000},
    )
    (tmp_path / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "stream_vips.cli", "run", "--config", str(tmp_path / "config.yaml")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    models = tmp_path / "models.jsonl"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if models.exists() and len(models.read_bytes().splitlines()) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert "SIGTERM" in err.decode()
    msgs = read_messages(models)  # every line is complete JSON
    events = ledger_events(tmp_path / "ledger.jsonl")
    versions = [m["version"] for m in msgs]
    assert versions == list(range(len(msgs)))
    # the step in flight was finished and published; the next one may have been paid ahead (unused)
    assert versions[-1] + 1 <= len(events) <= versions[-1] + 2
    acct = RdpAccountant()
    for msg in (msgs[0], msgs[-1]):
        messages.validate_message(msg)
        v = msg["version"]
        assert msg["privacy"]["epsilon_spent"] == pytest.approx(acct.epsilon(events[: v + 1], DELTA), rel=1e-9)


def test_a_seeded_restart_on_a_ledger_never_redraws_earlier_noise(tmp_path):
    """Rule 9 with a fixed seed: the noise stream after a restart differs from the first run's."""
    cfg = config_from_dict(cfg_dict(tmp_path), env={})
    first = Application.from_config(cfg, source=MemorySource([]))
    fresh_draws = first.engine.rng.random(4)
    first.ledger.close()
    Application.from_config(cfg, source=MemorySource(synthetic_lines(1_000))).run()
    assert len(ledger_events(tmp_path / "ledger.jsonl")) > 0
    restarted = Application.from_config(cfg, source=MemorySource([]))
    assert not np.allclose(restarted.engine.rng.random(4), fresh_draws)
    restarted.ledger.close()


def test_sources_that_know_their_lag_export_it_as_a_metric(tmp_path):
    class LaggingSource(MemorySource):
        def lag(self):
            return {("records", 0): 7, ("records", 2): 0}

    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": 50.0}), env={})
    app = Application.from_config(cfg, source=LaggingSource(synthetic_lines(300)), sink=MemorySink())
    app.run()
    text = generate_latest(app.metrics.registry).decode()
    assert 'stream_vips_consumer_lag_records{partition="0",topic="records"} 7.0' in text
    assert 'stream_vips_consumer_lag_records{partition="2",topic="records"} 0.0' in text


def test_a_model_update_that_fails_after_its_step_was_paid_is_never_published_nor_paid_again(tmp_path):
    """The engine pays (durable ledger append) before it draws noise and updates the model. When
    that update raises, the run stops before anything else leaves the process: the half-updated
    model is neither published nor checkpointed, so no downstream reader sees it, and a restart
    from the last checkpoint skips the paid stream position (no second charge) while every
    message it publishes accounts for the failed step too (epsilon is never under-counted)."""
    lines = synthetic_lines(1_500)
    d = cfg_dict(tmp_path, privacy={"epsilon": 50.0},
                 runtime={"checkpoint_path": str(tmp_path / "ckpt" / "state.npz"), "poll_max_records": 50})
    sink = MemorySink()
    app = Application.from_config(config_from_dict(d, env={}), source=SeekableSource(lines[:900]), sink=sink)
    original, calls = app.model.update, []

    def update(noisy_mean, rho):
        calls.append(rho)
        original(noisy_mean, rho)
        if len(calls) == 3:  # the model's state has already changed when the failure comes
            raise RuntimeError("injected failure inside the model update")

    app.model.update = update
    with pytest.raises(RuntimeError, match="injected failure"):
        app.run()
    paid = ledger_events(tmp_path / "ledger.jsonl")
    # the third step was paid before its update failed (and the fourth paid ahead with it, unused)
    assert len(paid) == 3 + app.engine.monitor.prepay and len(calls) == 3
    first_versions = [m["version"] for _, m in sink.messages]
    assert first_versions == [0, 1]  # each whole step once; the failed step's model never went out

    (offset,) = Checkpoint(tmp_path / "ckpt" / "state.npz").load()["offsets"].values()
    sink2 = MemorySink()
    second = Application.from_config(config_from_dict(d, env={}), source=SeekableSource(lines, start=offset),
                                     sink=sink2)
    second.run()
    events = ledger_events(tmp_path / "ledger.jsonl")
    assert events[:len(paid)] == paid and len(events) > len(paid)  # never reset, never rewritten
    versions = [m["version"] for _, m in sink2.messages]
    assert 2 not in versions and versions == sorted(versions) and min(versions) >= len(paid)
    assert second.learner.skipped_steps >= 1  # the paid position was skipped, not paid again
    acct = RdpAccountant()
    for _, msg in sink2.messages:
        v = msg["version"]
        assert msg["privacy"]["steps"] == v + 1
        assert msg["privacy"]["epsilon_spent"] == pytest.approx(acct.epsilon(events[: v + 1], DELTA), rel=1e-9)


def test_a_dead_letter_send_that_fails_stops_the_batch_before_any_step_is_paid(tmp_path):
    """The rejects of a decoded batch go to the dead-letter sink before the batch is offered to
    the learner: a sink that refuses them (synchronously, like a producer's size or metadata
    error) stops the run with nothing paid for that batch and nothing committed past it."""

    class RefusingSink(MemoryDeadLetterSink):
        def send(self, letters):
            raise OSError("dead-letter topic unavailable")

    lines = synthetic_lines(400)
    lines[350] = b'{"x": [0.1, 0.2'  # one malformed record after two steps' worth of arrivals
    source = MemorySource(lines)
    app = Application.from_config(config_from_dict(cfg_dict(tmp_path), env={}), source=source,
                                  dead_letter=RefusingSink(), sink=MemorySink())
    with pytest.raises(DeadLetterError, match="a dead letter was not delivered \\(dead-letter topic unavailable\\)"):
        app.run()
    assert ledger_events(tmp_path / "ledger.jsonl") == [] and source.committed_offset == 0


class LateRefusingSink(MemoryDeadLetterSink):
    """Takes letters at once and refuses them when they are confirmed, like a producer whose
    broker refuses a record on delivery."""

    def flush(self):
        if self.letters:
            raise OSError("MessageSizeTooLargeError")


def lines_with_a_malformed_fifth() -> list[bytes]:
    lines = synthetic_lines(400)
    lines[5] = b'{"x": [0.1, 0.2'  # admitted in any mode: the reservoir is still filling
    return lines


@pytest.mark.parametrize("validation", ["all", "admitted"])
def test_a_dead_letter_refused_only_when_confirmed_stops_before_the_batch_pays(tmp_path, validation):
    """A producer accepts a letter at once and learns of its refusal (the topic's size limit,
    too few in-sync replicas) only when it is confirmed: the confirmation must come before the
    learner sees the batch, not at the next commit after its steps were paid."""

    lines = lines_with_a_malformed_fifth()
    source = MemorySource(lines)
    app = Application.from_config(config_from_dict(cfg_dict(tmp_path, sampling={"validation": validation}), env={}),
                                  source=source, dead_letter=LateRefusingSink(), sink=MemorySink())
    with pytest.raises(DeadLetterError, match="MessageSizeTooLargeError"):
        app.run()
    assert ledger_events(tmp_path / "ledger.jsonl") == [] and source.committed_offset == 0


def test_a_dead_letter_refused_while_a_rebalance_drains_the_batch_in_flight_returns_no_positions(tmp_path):
    """The rebalance hook applies the batch in flight; a letter refused there must not escape
    into the Kafka client's callback: the hook returns no positions to commit and the loop
    raises the failure at its next commit."""
    from stream_vips.io import values_of

    lines = lines_with_a_malformed_fifth()
    app = Application.from_config(config_from_dict(cfg_dict(tmp_path), env={}), source=MemorySource(lines),
                                  dead_letter=LateRefusingSink(), sink=MemorySink())
    raws = app.source.poll(500, 0.01)
    values = values_of(raws)
    app._decoder.submit(values)
    app._inflight.append((raws, app._positions(), values))
    assert app._before_revoke() is None
    with pytest.raises(DeadLetterError, match="MessageSizeTooLargeError"):
        app._confirm_dead_letters()
    assert app.learner.engine.monitor.steps == 0


@pytest.mark.parametrize("unit", ["record", "key"])
def test_an_admitted_malformed_record_whose_dead_letter_fails_stops_before_its_steps_are_paid(tmp_path, unit):
    """``sampling.validation: admitted`` decodes only what the reservoir admits, inside the offer;
    the rejects it finds must still reach the sink before any step that follows their decoding.
    They used to be sent after the batch's steps: with a sink that keeps refusing, every restart
    (no checkpoint yet) paid those steps again before stopping."""

    class RefusingSink(MemoryDeadLetterSink):
        def send(self, letters):
            raise OSError("dead-letter topic unavailable")

    lines = synthetic_lines(400)
    lines[5] = b'{"x": [0.1, 0.2'  # admitted: the reservoir is still filling

    def source() -> MemorySource:
        src = MemorySource(lines)
        if unit == "key":  # admission before decoding reads the message key
            src._queue = collections.deque(RawRecord(r.value, {**r.origin, "key": f"u{i}".encode()})
                                           for i, r in enumerate(src._queue))
        return src

    privacy = {"unit": "key", "max_records_per_key": 2} if unit == "key" else {}
    cfg = cfg_dict(tmp_path, privacy=privacy, sampling={"validation": "admitted"})
    for _ in range(2):  # a restart meets the same refusing sink and pays nothing either
        src = source()
        app = Application.from_config(config_from_dict(cfg, env={}), source=src, dead_letter=RefusingSink(),
                                      sink=MemorySink())
        with pytest.raises(DeadLetterError, match="a dead letter was not delivered"):
            app.run()
        assert ledger_events(tmp_path / "ledger.jsonl") == [] and src.committed_offset == 0


@pytest.mark.parametrize("validation", ["all", "admitted"])
def test_a_keyless_record_whose_dead_letter_fails_stops_the_batch_before_any_step_is_paid(tmp_path, validation):
    """With ``privacy.unit: key`` an arrival without a key is a ``missing_key`` dead letter known
    before the batch is offered (for either validation mode), so it goes to the sink first: a
    refused send pays nothing for its batch, which a restart without a checkpoint would pay again."""

    class RefusingSink(MemoryDeadLetterSink):
        def send(self, letters):
            raise OSError("dead-letter topic unavailable")

    users = [f"u{i}" for i in range(400)]
    users[350] = None  # one keyless record after two steps' worth of arrivals, in the same poll
    if validation == "all":  # the key field (decoded before admission)
        docs = [{**json.loads(line), **({"user": u} if u else {})} for u, line in zip(users, synthetic_lines(400))]
        source, key_field = MemorySource([json.dumps(doc) for doc in docs]), "user"
    else:  # admission before decoding needs the message key
        source, key_field = MemorySource(synthetic_lines(400)), None
        source._queue = collections.deque(RawRecord(r.value, {**r.origin, "key": u and u.encode()})
                                          for r, u in zip(source._queue, users))
    cfg = cfg_dict(tmp_path, privacy={"unit": "key", "key_field": key_field, "max_records_per_key": 2},
                   sampling={"validation": validation})
    app = Application.from_config(config_from_dict(cfg, env={}), source=source, dead_letter=RefusingSink(),
                                  sink=MemorySink())
    with pytest.raises(DeadLetterError, match="a dead letter was not delivered \\(dead-letter topic unavailable\\)"):
        app.run()
    assert ledger_events(tmp_path / "ledger.jsonl") == [] and source.committed_offset == 0
