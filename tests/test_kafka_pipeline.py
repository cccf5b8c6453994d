"""End to end on the real broker: Kafka in, private updates, Kafka out, ledger, restarts and outages."""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

from connectors.kafka import KafkaLedger, dead_letter_from_record, dead_letter_reasons, read_topic
from kafka_broker import (
    CLIENTS,
    WEAK_LEDGER,
    KafkaBroker,
    build_app,
    create_topic,
    linreg_records,
    pipeline_config,
    produce,
    unique_topic,
)
from stream_vips import messages
from stream_vips.cli import inspect as sv_inspect
from stream_vips.client import ModelReader
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.service.checkpoint import Checkpoint

pytestmark = pytest.mark.kafka
each_client = pytest.mark.parametrize("client", CLIENTS)
HERE = Path(__file__).resolve().parent


def _ledger_epsilon(bootstrap: str, topic: str, ledger_id: str) -> tuple[float, int]:
    """Spent epsilon and number of events, replayed from the Kafka ledger."""
    ledger = KafkaLedger(bootstrap, topic, ledger_id=ledger_id, **WEAK_LEDGER, create_topic=False)
    try:
        monitor = BudgetMonitor(1e9, 1e-5, make_accountant("auto", "poisson"), ledger)
        return monitor.spent(), len(ledger.events())
    finally:
        ledger.close()


def _versions(msgs: list[dict]) -> list[int]:
    """Published versions, leaving out the halt notice (the last model re-sent with halted: true)."""
    out = []
    for i, m in enumerate(msgs):
        if m["privacy"]["halted"] and i > 0 and msgs[i - 1]["version"] == m["version"]:
            assert msgs[i - 1]["natural_parameters"] == m["natural_parameters"]
            continue
        out.append(m["version"])
    return out


def _committed_total(bootstrap: str, group: str) -> int:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return sum(om.offset for om in admin.list_group_offsets(group)[group].values())
    finally:
        admin.close()


@pytest.fixture(scope="module", params=CLIENTS)
def e2e(kafka_bootstrap, request):
    """100,000 records over 3 partitions (plus 10,000 that arrive after the budget is spent), on
    each Kafka client library."""
    names = {k: unique_topic(k) for k in ("in", "models", "dlq", "ledger", "g")}
    create_topic(kafka_bootstrap, names["in"], partitions=3)
    produce(kafka_bootstrap, names["in"], linreg_records(110_000), partitions=3)
    spec = {"config": pipeline_config(kafka_bootstrap, input_topic=names["in"], model_topic=names["models"],
                                      dead_letter_topic=names["dlq"], group_id=names["g"], planned_steps=20,
                                      client=request.param),
            "ledger_topic": names["ledger"], "ledger_id": "m"}
    app = build_app(spec)
    stats = app.run()
    return {"names": names, "stats": stats, "app": app, "bootstrap": kafka_bootstrap}


def test_end_to_end_publishes_every_update_and_halting_stops_consumption(e2e):
    stats, names, bs = e2e["stats"], e2e["names"], e2e["bootstrap"]
    # reservoir of 5,000 full at record 5,000, then a step every 5,000 records: 20 steps fit the
    # budget (planned_steps = 20); the 21st, due at record 105,000, is refused and halts.
    assert stats.updates == 20 and stats.halted
    # the 21st step is refused inside the poll batch that holds record 105,000; the rest of that
    # batch was consumed (and is committed) with it, so accepted ends at that batch's end, which
    # depends on how the client split the stream into polls (at most poll_max_records = 5,000):
    # 105,000 when the polls fall on the 5,000-record steps, more when a loaded broker returns
    # shorter fetches
    assert 105_000 <= stats.accepted < 105_000 + 5_000
    assert 105_000 <= stats.records < 110_000
    assert _committed_total(bs, names["g"]) == stats.records  # nothing consumed after the halt

    spent, n_events = _ledger_epsilon(bs, names["ledger"], "m")
    assert n_events == 20
    with ModelReader(bs, names["models"]) as reader:
        reader.poll()
        last = reader.latest()["m"]
    assert last["version"] == 19 and last["privacy"]["halted"]
    assert last["privacy"]["epsilon_spent"] == pytest.approx(spent, rel=1e-12)
    assert spent <= 2.0


def test_kcat_reads_and_the_schema_validates_every_model_message(e2e):
    names, bs = e2e["names"], e2e["bootstrap"]
    out = subprocess.run(["kcat", "-C", "-b", bs, "-t", names["models"], "-e", "-q", "-J",
                          "-X", "isolation.level=read_committed"],
                         capture_output=True, text=True, timeout=60, check=True)
    envelopes = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    msgs = [messages.loads(env["payload"]) for env in envelopes]  # validates against the JSON Schema
    assert {env["key"] for env in envelopes} == {"m"}
    assert _versions(msgs) == list(range(20))
    eps = [m["privacy"]["epsilon_spent"] for m in msgs]
    assert all(b >= a for a, b in zip(eps, eps[1:]))
    for m in msgs:
        assert set(messages.decode_state(m)) == {"precision", "shift"}


def test_inspect_prints_the_latest_model_with_its_privacy_report(e2e, capsys):
    names, bs = e2e["names"], e2e["bootstrap"]
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sv_inspect.add_parser(sub)
    assert sv_inspect.run(parser.parse_args(["inspect", "--bootstrap", bs, "--topic", names["models"], "--json"])) == 0
    report = json.loads(capsys.readouterr().out)
    (model,) = report["models"]
    assert model["model_id"] == "m" and model["version"] == 19
    assert model["natural_parameters"]["precision"]["shape"] == [4, 4]
    assert model["privacy"]["halted"] is True
    assert sv_inspect.run(parser.parse_args(["inspect", "--bootstrap", bs, "--topic", names["models"]])) == 0
    text = capsys.readouterr().out
    assert "model m  family linreg  version 19" in text and "HALTED" in text
    assert sv_inspect.run(parser.parse_args(["inspect", "--bootstrap", bs, "--topic", names["models"],
                                             "--model-id", "absent"])) == 1


@each_client
def test_malformed_records_go_to_dead_letters_and_the_pipeline_keeps_going(kafka_bootstrap, client):
    names = {k: unique_topic(k) for k in ("in", "models", "dlq", "ledger", "g")}
    create_topic(kafka_bootstrap, names["in"], partitions=2)
    good = linreg_records(3000, seed=3)
    # None: a tombstone (no value), which once stopped the service at every restart
    bad = [b"{not json", b'{"x": [1, 2, 3, 4]}', b"\xff\xfe", b'{"x": [1, 2], "y": 0}', b'[1, 2]', None]
    values = good[:1000] + bad + good[1000:]
    placed = produce(kafka_bootstrap, names["in"], values, partitions=2, key_fn=lambda i: b"k%d" % i)
    spec = {"config": pipeline_config(kafka_bootstrap, input_topic=names["in"], model_topic=names["models"],
                                      dead_letter_topic=names["dlq"], group_id=names["g"], reservoir=1000,
                                      batch_size=100, every_records=1000, source_options={"until_end": True},
                                      noise_multiplier=2.0, epsilon=5.0, client=client),
            "ledger_topic": names["ledger"], "ledger_id": "dl"}
    stats = build_app(spec).run()
    assert stats.records == 3006 and stats.accepted == 3000 and stats.updates == 3
    letters = [dead_letter_from_record(r) for r in read_topic(kafka_bootstrap, names["dlq"])]
    by_value = {d["value"]: d for d in letters}
    assert set(by_value) == set(bad)
    assert by_value[b"{not json"]["reason"] == "invalid_json"
    assert by_value[b'{"x": [1, 2, 3, 4]}']["reason"] == "missing_field"
    assert by_value[b'{"x": [1, 2], "y": 0}']["reason"] == "wrong_shape"
    assert by_value[b"[1, 2]"]["reason"] == "not_object"
    assert by_value[None]["reason"] == "tombstone" and "length" not in by_value[None]
    # what `stream-vips report --dead-letter-topic` counts
    assert dead_letter_reasons(kafka_bootstrap, names["dlq"]) == collections.Counter(d["reason"] for d in letters)
    for i, value in enumerate(values):
        if value in by_value:
            src = by_value[value]["source"]
            assert (src["topic"], int(src["partition"]), int(src["offset"])) == (names["in"], *placed[i])


def test_a_model_over_the_1_mib_limit_is_delivered_and_read_back(kafka_bootstrap):
    names = {k: unique_topic(k) for k in ("in", "models", "dlq", "ledger", "g")}
    create_topic(kafka_bootstrap, names["in"])
    rng = np.random.default_rng(5)
    dim = 400
    produce(kafka_bootstrap, names["in"],
            [json.dumps({"x": (rng.normal(size=dim) / 40).round(5).tolist(), "y": 0.1}).encode() for _ in range(60)])
    cfg = pipeline_config(kafka_bootstrap, input_topic=names["in"], model_topic=names["models"],
                          dead_letter_topic=names["dlq"], group_id=names["g"], reservoir=50, batch_size=25,
                          every_records=50, source_options={"until_end": True}, noise_multiplier=2.0,
                          epsilon=5.0)
    cfg["model"]["params"] = {"dim": dim}
    app = build_app({"config": cfg, "ledger_topic": names["ledger"], "ledger_id": "big"})
    stats = app.run()
    assert stats.updates == 1
    assert len(messages.dumps(stats.last_message)) > 1_048_576
    with ModelReader(kafka_bootstrap, names["models"]) as reader:
        post = reader.posterior("m", wait_s=10.0)
    np.testing.assert_array_equal(post.model.state()["precision"], app.model.state()["precision"])


def test_broker_outage_of_10_seconds_is_survived(tmp_path):
    with KafkaBroker() as broker:
        bs = broker.bootstrap
        names = {k: unique_topic(k) for k in ("in", "models", "dlq", "ledger", "g")}
        create_topic(bs, names["in"], partitions=3)
        produce(bs, names["in"], linreg_records(20_000, seed=7), partitions=3)
        spec = {"config": pipeline_config(bs, input_topic=names["in"], model_topic=names["models"],
                                          dead_letter_topic=names["dlq"], group_id=names["g"], reservoir=2000,
                                          batch_size=200, every_records=2000, noise_multiplier=2.0, epsilon=5.0,
                                          source_options={"until_end": True, "max_partition_fetch_bytes": 65536},
                                          sink_options={"send_timeout_s": 60.0}),
                "ledger_topic": names["ledger"], "ledger_id": "outage"}
        spec["config"]["runtime"]["poll_max_records"] = 500
        app = build_app(spec)
        errors: list[str] = []

        def run() -> None:
            try:
                app.run()
            except BaseException:  # reported by the assertion below
                errors.append(traceback.format_exc())

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while app.stats.published < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app.stats.published >= 2
        broker.stop()
        down_at = app.stats.records
        time.sleep(10)
        broker.start()
        thread.join(timeout=180)
        assert not thread.is_alive() and not errors, "\n".join(errors)
        assert down_at < 20_000 and app.stats.records == 20_000
        spent, n_events = _ledger_epsilon(bs, names["ledger"], "outage")
        msgs = [messages.loads(r.value) for r in read_topic(bs, names["models"])]
        assert _versions(msgs) == list(range(app.stats.updates))
        # the topic has no end the source knows of: the next step was paid ahead, unused
        assert n_events == app.stats.updates + app.engine.monitor.prepay
        assert msgs[-1]["privacy"]["epsilon_spent"] < spent


@each_client
def test_sigkill_restarts_lose_no_record_and_never_repeat_a_version(kafka_bootstrap, tmp_path, client):
    bs = kafka_bootstrap
    n = 40_000
    names = {k: unique_topic(k) for k in ("in", "models", "dlq", "ledger", "g")}
    create_topic(bs, names["in"], partitions=3)
    placed = produce(bs, names["in"], linreg_records(n, seed=11), partitions=3)
    cfg = pipeline_config(bs, input_topic=names["in"], model_topic=names["models"], dead_letter_topic=names["dlq"],
                          group_id=names["g"], reservoir=2000, batch_size=200, every_records=1000,
                          noise_multiplier=2.0, epsilon=5.0, client=client,
                          source_options={"until_end": True, "group_instance_id": "kill-0",
                                                             "session_timeout_ms": 10000})
    cfg["runtime"]["poll_max_records"] = 250
    consumed_log = tmp_path / "consumed.txt"
    spec = {"config": cfg, "ledger_topic": names["ledger"], "ledger_id": "kill",
            "checkpoint": str(tmp_path / "ckpt" / "reservoir.npz"), "consumed_log": str(consumed_log)}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)]),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    rnd = random.Random(1234)
    kills, spent_history, rc = 0, [0.0], None

    def lines() -> int:
        return sum(1 for _ in open(consumed_log)) if consumed_log.exists() else 0

    for _attempt in range(15):
        start_lines = lines()
        proc = subprocess.Popen([sys.executable, str(HERE / "kafka_broker.py"), str(spec_path)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if kills < 5:
            deadline = time.monotonic() + 60
            while lines() < start_lines + 500 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rnd.uniform(0.0, 0.1))  # a random point soon after: five kills fit in 40,000 records
        if kills < 5 and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            kills += 1
        else:
            _, err = proc.communicate(timeout=180)
            rc = proc.returncode
            assert rc == 0, err.decode()[-3000:]
        spent, _ = _ledger_epsilon(bs, names["ledger"], "kill")
        assert spent >= spent_history[-1]  # spent epsilon never goes down
        spent_history.append(spent)
        if rc == 0:
            break
    assert kills >= 5 and rc == 0

    consumed = {tuple(map(int, line.split())) for line in open(consumed_log)}
    assert consumed == set(placed)  # every produced offset was consumed, none skipped
    state = Checkpoint(spec["checkpoint"]).load()
    assert state["reservoir"]["seen"] == n  # ... and each entered the reservoir exactly once
    assert state["offsets"] == {(names["in"], p): sum(1 for q, _ in placed if q == p) for p in range(3)}
    assert (Path(spec["checkpoint"]).stat().st_mode & 0o777) == 0o600

    msgs = [messages.loads(r.value) for r in read_topic(bs, names["models"])]
    versions = _versions(msgs)
    assert len(versions) == len(set(versions)) and versions == sorted(versions)  # never repeated
    spent, n_events = _ledger_epsilon(bs, names["ledger"], "kill")
    # the last life's last step, and the one it paid ahead (the topic has no end the source knows of)
    assert versions[-1] == n_events - 2
    assert msgs[-1]["privacy"]["epsilon_spent"] < spent


@each_client
def test_a_rebalance_mid_run_with_the_decode_worker_hands_over_each_record_once(kafka_bootstrap, client):
    """A second member joins while the pipeline has a batch in flight in its decode worker: the
    revocation applies that batch and commits after it, so the two members together process
    every record once (the committed offsets count exactly the records both processed)."""
    from connectors.kafka import KafkaSource
    from test_kafka_connectors import _committed

    names = {k: unique_topic(k) for k in ("in", "models", "dlq", "ledger", "g")}
    create_topic(kafka_bootstrap, names["in"], partitions=4)
    produce(kafka_bootstrap, names["in"], linreg_records(20_000, seed=3), partitions=4)
    member = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, "commit_interval_s": 3600.0}
    cfg = pipeline_config(kafka_bootstrap, input_topic=names["in"], model_topic=names["models"],
                          dead_letter_topic=names["dlq"], group_id=names["g"], reservoir=1000, batch_size=100,
                          every_records=1000, noise_multiplier=2.0, epsilon=50.0, source_options=member,
                          client=client)
    cfg["runtime"].update(decode_workers=1, poll_max_records=100)
    app = build_app({"config": cfg, "ledger_topic": names["ledger"], "ledger_id": "rebal"})
    in_flight_at_revocation, handed_over = [], []
    finish = app._before_revoke

    def before_revoke():
        in_flight_at_revocation.append(len(app._inflight))
        after_in_flight = app._inflight[-1][1] if app._inflight else None
        positions = finish()
        handed_over.append((after_in_flight, positions))
        return positions

    app._before_revoke = before_revoke
    app.progress = lambda a: time.sleep(0.05)  # about 2k records/s: the rebalance comes mid-stream
    errors: list[str] = []

    def run() -> None:
        try:
            app.run()
        except BaseException:
            errors.append(traceback.format_exc())

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while app.stats.records < 1000 and time.monotonic() < deadline:
        time.sleep(0.05)
    other = KafkaSource(kafka_bootstrap, names["in"], group_id=names["g"], **member, client=client)
    got = 0
    while not in_flight_at_revocation and time.monotonic() < deadline:
        got += len(other.poll(100, 0.1))  # joins; commits nothing yet
    committed_at_revocation = _committed(kafka_bootstrap, names["g"])
    other.commit()
    for _ in range(20):
        got += len(other.poll(100, 0.1))
        other.commit()
    app.stop()
    thread.join(60)
    other.close()
    assert not thread.is_alive() and not errors, "\n".join(errors)
    assert in_flight_at_revocation and in_flight_at_revocation[0] == 1  # a batch was in flight
    after_in_flight, positions = handed_over[0]
    assert positions == after_in_flight == committed_at_revocation  # ... and was handed over applied
    assert got > 0 and app.stats.records > 1000
    assert sum(_committed(kafka_bootstrap, names["g"]).values()) == app.stats.records + got


@each_client
def test_an_input_topic_created_after_a_static_member_started_is_consumed(kafka_bootstrap, client, caplog):
    """A static member started before its input topic existed, stopped, and started again after
    the topic was created used to keep the group's empty assignment for ever (kafka-python: 0
    records for minutes, no warning). Now both lives say the topic is missing or unassigned, and
    the second consumes everything within a few source checks."""
    import logging

    names = {k: unique_topic(k) for k in ("in", "models", "dlq", "ledger", "g")}
    cfg = pipeline_config(kafka_bootstrap, input_topic=names["in"], model_topic=names["models"],
                          dead_letter_topic=names["dlq"], group_id=names["g"], reservoir=500, batch_size=50,
                          every_records=500, noise_multiplier=2.0, epsilon=50.0, client=client,
                          source_options={"group_instance_id": f"{names['g']}-0", "until_end": True})
    cfg["runtime"] = {**cfg["runtime"], "source_check_s": 1.0, "on_halt": "exit"}
    spec = {"config": cfg, "ledger_topic": names["ledger"], "ledger_id": "late"}

    def run_for(app, seconds: float):
        thread = threading.Thread(target=app.run, daemon=True)
        thread.start()
        thread.join(seconds)
        if thread.is_alive():
            app.stop()
            thread.join(30)
        return not thread.is_alive() and app.source.exhausted

    with caplog.at_level(logging.WARNING, logger="stream_vips.service.app"):
        early = build_app(spec)
        assert not run_for(early, 4.0)
    assert early.metrics.source_topic_missing.labels(topic=names["in"])._value.get() == 1
    assert any("does not exist" in r.getMessage() for r in caplog.records)
    assert early.stats.records == 0

    create_topic(kafka_bootstrap, names["in"], partitions=2)
    produce(kafka_bootstrap, names["in"], linreg_records(2000, seed=5), partitions=2)
    late = build_app(spec)
    started = time.monotonic()
    assert run_for(late, 60.0), "the restarted static member consumed nothing"
    assert late.stats.records == 2000 and late.stats.updates >= 1
    assert time.monotonic() - started < 60
    assert late.metrics.source_topic_missing.labels(topic=names["in"])._value.get() == 0
