"""The privacy argument across the life of the service, against the real broker.

Each test is an invariant over restarts, rebalances, lost or rolled-back ledgers, hostile records
and signals: no record is ever offered to the reservoir twice, spent epsilon never decreases
(recomputed independently from the ledger), no start accepts state its ledger did not pay for,
nothing is committed past an unconfirmed dead letter, and no restart pays again for positions an
earlier life already paid for.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

from connectors.kafka import KafkaConnectorError, KafkaSource, dead_letter_from_record, read_topic
from kafka_broker import CLIENTS, WEAK_LEDGER, build_app, create_topic, pipeline_config, produce, unique_topic
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.ledger import FileLedger, LedgerCorrupt, LedgerMismatch
from stream_vips.service.app import DeadLetterError
from stream_vips.service.checkpoint import Checkpoint

pytestmark = pytest.mark.kafka
each_client = pytest.mark.parametrize("client", CLIENTS)
HERE = Path(__file__).resolve().parent
DELTA = 1e-5


def id_records(n: int, start: int = 0, bad_every: int = 0) -> list[bytes]:
    """Linreg records whose ``y`` is a unique id (``i / 10000``, inside the clip bound |y| <= 1);
    every ``bad_every``-th one is malformed (it still takes an arrival position)."""
    rng = np.random.default_rng(start)
    x = rng.uniform(-0.5, 0.5, size=(n, 4)).round(6)
    out = []
    for i in range(n):
        if bad_every and i % bad_every == bad_every - 1:
            out.append(b'{"x": "not a vector", "id": %d}' % (start + i))
        else:
            out.append(json.dumps({"x": x[i].tolist(), "y": (start + i) / 10_000}).encode())
    return out


def recorded_arrivals(app) -> list[float]:
    """Wrap the reservoir so every accepted arrival's id is recorded in order."""
    seen: list[float] = []
    add = app.reservoir.add_batch

    def add_batch(rows, accepted=None):
        seen.extend(np.asarray(rows["y"]).tolist())
        return add(rows, accepted=accepted)

    app.reservoir.add_batch = add_batch
    return seen


def ledger_epsilon(events: list, sampling: str = "poisson") -> float:
    """epsilon of the ledger's events, recomputed by a fresh accountant (not the monitor's)."""
    return make_accountant("auto", sampling).epsilon(events, DELTA) if events else 0.0


def names() -> dict[str, str]:
    return {k: unique_topic(k) for k in ("in", "models", "dlq", "ledger", "g")}


def config(bs: str, n: dict, **kw) -> dict:
    kw.setdefault("reservoir", 500)
    kw.setdefault("batch_size", 100)
    kw.setdefault("every_records", 500)
    kw.setdefault("noise_multiplier", 2.0)
    kw.setdefault("epsilon", 50.0)
    source = {"until_end": True, "session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
              **kw.pop("source_options", {})}
    cfg = pipeline_config(bs, input_topic=n["in"], model_topic=n["models"], dead_letter_topic=n["dlq"],
                          group_id=n["g"], source_options=source, **kw)
    cfg["runtime"].update(poll_max_records=200)
    return cfg


@each_client
def test_restore_then_two_rebalances_never_offer_a_record_twice(kafka_bootstrap, tmp_path, client):
    """Life 1 checkpoints and stops mid-stream; life 2 restores, then a second member joins
    (reads a partition without committing) and leaves: every produced record is offered to the
    reservoir exactly once over both lives (the malformed ones are dead letters), and the
    reservoir never holds one id twice."""
    bs, n = kafka_bootstrap, names()
    create_topic(bs, n["in"], partitions=2)
    total = 6000
    produce(bs, n["in"], id_records(total, bad_every=97), partitions=2)
    bad = sum(1 for i in range(total) if i % 97 == 96)
    spec = {"config": config(bs, n, client=client), "ledger_topic": n["ledger"], "ledger_id": "reb",
            "checkpoint": str(tmp_path / "ckpt.npz")}

    first = build_app(spec)
    offered_1 = recorded_arrivals(first)
    first.progress = lambda a: a.stop() if a.stats.records >= 2000 else None
    first.run()
    state = Checkpoint(spec["checkpoint"]).load()
    assert state["reservoir"]["seen"] == first.stats.records  # the graceful stop checkpointed everything

    spec["config"]["source"]["until_end"] = False  # a partition held by the other member is not at its end
    second = build_app(spec)
    offered_2 = recorded_arrivals(second)
    give_up = time.monotonic() + 90

    member_left = threading.Event()
    second.poll_max_records = 100

    def progress(app) -> None:
        if not member_left.is_set():
            time.sleep(0.25)  # about 400 records/s until the member has come and gone
        if app.reservoir.seen >= total or time.monotonic() > give_up:
            app.stop()

    second.progress = progress
    errors: list[str] = []

    def run() -> None:
        try:
            second.run()
        except BaseException:
            errors.append(traceback.format_exc())

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 60
    while second.stats.records < 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    other = KafkaSource(bs, n["in"], group_id=n["g"], session_timeout_ms=6000, heartbeat_interval_ms=500,
                        commit_interval_s=3600.0, client=client)
    taken = 0
    joined = time.monotonic()
    while time.monotonic() - joined < 4:
        taken += len(other.poll(100, 0.1))  # reads without ever committing: its records come back
    other._closed.set()
    other._client.close()  # leaves the group without committing: a second rebalance
    member_left.set()
    thread.join(120)
    assert not thread.is_alive() and not errors, "\n".join(errors)
    assert taken > 0  # the member did take a partition

    ids = offered_1 + offered_2
    assert len(ids) == len(set(ids)), "a record was offered to the reservoir twice"
    good = {i / 10_000 for i in range(total) if i % 97 != 96}
    assert set(ids) == good  # every valid record was offered ...
    assert second.reservoir.seen == total  # ... and every arrival, valid or not, took one position
    held = second.reservoir.columns["y"][second.reservoir.valid]
    assert len(held) == len(set(held.tolist()))
    letters = [dead_letter_from_record(r) for r in read_topic(bs, n["dlq"])]
    assert len({(d["source"]["partition"], d["source"]["offset"]) for d in letters}) == bad


@each_client
def test_duplicates_below_the_delivered_offset_are_dropped_by_the_source(kafka_bootstrap, client):
    """Resuming a partition at an older offset (a failed commit, an eviction, a stale seek)
    never hands the pipeline a record it already returned."""
    bs, n = kafka_bootstrap, names()
    create_topic(bs, n["in"], partitions=1)
    produce(bs, n["in"], id_records(300))
    src = KafkaSource(bs, n["in"], group_id=n["g"], until_end=True, client=client)
    try:
        got = []
        while len(got) < 300:
            got.extend(r.origin["offset"] for r in src.poll(100, 0.5))
        (tp,) = src._client.assignment()
        src._client.seek(tp, 50)  # as if the partition came back at an old committed offset
        produce(bs, n["in"], id_records(10, start=300))
        again = []
        deadline = time.monotonic() + 20
        while len(again) < 10 and time.monotonic() < deadline:
            again.extend(r.origin["offset"] for r in src.poll(100, 0.5))
        assert again == list(range(300, 310))
        assert src.duplicates_dropped == 250
    finally:
        src.close()


def _file_life(bs: str, n: dict, tmp_path: Path, records: int) -> dict:
    """A pipeline with a file ledger, a JSONL model file and a checkpoint, run to the topic's end."""
    cfg = config(bs, n)
    cfg["sink"] = {"type": "jsonl", "path": str(tmp_path / "models.jsonl")}
    spec = {"config": cfg, "ledger_path": str(tmp_path / "ledger.jsonl"), "checkpoint": str(tmp_path / "ckpt.npz")}
    return spec


def test_a_lost_rolled_back_or_corrupt_ledger_refuses_the_start(kafka_bootstrap, tmp_path):
    bs, n = kafka_bootstrap, names()
    create_topic(bs, n["in"], partitions=1)
    produce(bs, n["in"], id_records(4000))
    spec = _file_life(bs, n, tmp_path, 4000)
    ledger, ckpt, models = Path(spec["ledger_path"]), Path(spec["checkpoint"]), tmp_path / "models.jsonl"
    app = build_app(spec)
    app.run()
    steps = app.stats.updates
    assert steps == 8  # full at 500, then a step per 500 arrivals
    with FileLedger(ledger) as led:
        events = led.events()
    assert len(events) == steps + app.engine.monitor.prepay  # the next step was paid ahead (the topic has no end)
    spent = ledger_epsilon(events)
    last = json.loads(models.read_text().splitlines()[-1])  # its epsilon: the steps durable when it was built
    assert last["privacy"]["epsilon_spent"] == pytest.approx(ledger_epsilon(events[:steps]), rel=1e-9)
    saved = ledger.read_bytes()

    ledger.unlink()  # deleted: a new ledger would start at epsilon 0
    with pytest.raises(LedgerMismatch, match="deleted or replaced"):
        build_app(spec)
    ledger.write_bytes(b"".join(saved.splitlines(keepends=True)[:-5]))  # rolled back five lines
    with pytest.raises(LedgerMismatch, match="rolled back"):
        build_app(spec)
    ckpt.rename(tmp_path / "aside.npz")  # the model file alone still binds the ledger
    with pytest.raises(LedgerMismatch, match="published model 'm' version 7"):
        build_app(spec)
    (tmp_path / "aside.npz").rename(ckpt)
    lines = saved.splitlines(keepends=True)
    lines[-1] = lines[-1].replace(b'"count":1', b'"count":2')  # a complete last line, changed
    ledger.write_bytes(b"".join(lines))
    with pytest.raises(LedgerCorrupt, match=f"line {len(events) + 1} is corrupt: checksum"):
        build_app(spec)
    assert ledger.read_bytes() == b"".join(lines)  # the evidence is kept, not cut

    ledger.write_bytes(saved)  # restored: the start is accepted and spends on from where it was
    produce(bs, n["in"], id_records(1000, start=4000))
    again = build_app(spec)
    again.run()
    with FileLedger(ledger) as led:
        after = led.events()
    assert len(after) > len(events) and after[:len(events)] == events
    assert ledger_epsilon(after) > spent  # never decreases over the model's life


def test_reset_is_explicit_and_keeps_the_old_ledger(kafka_bootstrap, tmp_path):
    from stream_vips.cli import reset as sv_reset
    bs, n = kafka_bootstrap, names()
    create_topic(bs, n["in"], partitions=1)
    produce(bs, n["in"], id_records(1500))
    spec = _file_life(bs, n, tmp_path, 1500)
    build_app(spec).run()
    Path(spec["ledger_path"]).unlink()
    cfg = {**spec["config"], "privacy": {**spec["config"]["privacy"],
                                         "ledger": {"type": "file", "path": spec["ledger_path"]}},
           "runtime": {**spec["config"]["runtime"], "checkpoint_path": spec["checkpoint"]}}
    cfg_path = tmp_path / "cfg.json"  # YAML is a superset of JSON
    cfg_path.write_text(json.dumps(cfg))
    args = sv_reset.add_parser(__import__("argparse").ArgumentParser().add_subparsers()).parse_args
    assert sv_reset.run(args(["--config", str(cfg_path)])) == 2  # needs --yes
    with pytest.raises(LedgerMismatch):
        build_app(spec)
    assert sv_reset.run(args(["--config", str(cfg_path), "--yes"])) == 0
    kept = list(tmp_path.glob("ledger.jsonl.superseded-*"))
    assert len(kept) == 1  # the refused start's empty ledger is kept, not deleted
    build_app(spec).run()  # accepted now: the new genesis names the old ledger
    with FileLedger(spec["ledger_path"]) as led:
        assert led.supersedes and len(led.events()) == 0  # no new records arrived: nothing spent


def test_a_deleted_kafka_ledger_topic_refuses_the_start(kafka_bootstrap, tmp_path):
    from kafka import KafkaAdminClient

    bs, n = kafka_bootstrap, names()
    create_topic(bs, n["in"], partitions=1)
    produce(bs, n["in"], id_records(1500))
    spec = {"config": config(bs, n), "ledger_topic": n["ledger"], "ledger_id": "gone"}
    app = build_app(spec)
    app.run()
    assert app.stats.updates == 3
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        admin.delete_topics([n["ledger"]])
    finally:
        admin.close()
    time.sleep(1.0)
    with pytest.raises(LedgerMismatch, match="published model 'm' version 2 was paid for by ledger"):
        build_app(spec)  # the ledger topic was created again, empty: the model topic says otherwise


def test_the_kafka_ledger_refuses_weak_durability_unless_told(kafka_bootstrap):
    from connectors.kafka import KafkaLedger

    with pytest.raises(KafkaConnectorError, match="weaker than 3 / 2"):
        KafkaLedger(kafka_bootstrap, unique_topic("ledger"), name="w", replication_factor=1)
    with pytest.raises(KafkaConnectorError,
                       match="cannot create topic .* replication factor 3: InvalidReplicationFactor"):
        KafkaLedger(kafka_bootstrap, unique_topic("ledger"), name="w")  # one broker cannot hold 3 replicas
    topic = create_topic(kafka_bootstrap, unique_topic("ledger"))  # exists with one replica
    with pytest.raises(KafkaConnectorError, match="1 replica"):
        KafkaLedger(kafka_bootstrap, topic, name="w", create_topic=False)


@each_client
def test_an_oversized_malformed_record_is_one_truncated_dead_letter_and_costs_nothing(kafka_bootstrap, tmp_path,
                                                                                      client):
    """1.2 MB of garbage on a stream whose dead-letter topic takes 100 KB: one truncated dead
    letter (length and hash kept), no crash, and the same steps as without it. A dead-letter
    topic that refuses a letter stops the run with nothing committed past it, and the restart
    from the checkpoint pays for no position twice."""
    bs, n = kafka_bootstrap, names()
    create_topic(bs, n["in"], partitions=1, configs={"max.message.bytes": str(2_000_000)})
    create_topic(bs, n["dlq"], partitions=1, configs={"max.message.bytes": str(100_000)})
    noise = base64.b64encode(np.random.default_rng(5).bytes(900_000))  # incompressible, 1.2 MB
    huge = b'{"x": "' + noise + b'"}'
    values = id_records(1200) + [huge] + id_records(1300, start=1200)
    from kafka import KafkaProducer

    prod = KafkaProducer(bootstrap_servers=bs, max_request_size=3_000_000)
    for v in values:
        prod.send(n["in"], v)
    prod.flush()
    prod.close()
    source = {"max_partition_fetch_bytes": 2_000_000}
    reference = build_app({"config": config(bs, {**n, "g": n["g"] + "-ref", "dlq": n["dlq"] + "-ref",
                                                  "models": n["models"] + "-ref"}, source_options=source,
                                            client=client),
                           "ledger_topic": n["ledger"], "ledger_id": "ref"})
    reference.run()  # the same stream, uninterrupted: the steps it should cost
    assert reference.stats.updates == 5  # a step per 500 arrivals from 500 to 2500

    spec = {"config": config(bs, n, source_options=source, client=client), "ledger_topic": n["ledger"],
            "ledger_id": "big",
            "checkpoint": str(tmp_path / "ckpt.npz"), "checkpoint_interval_s": 600.0}
    spec["config"]["runtime"]["dead_letter_max_bytes"] = 900_000  # too big for the topic: refused
    with pytest.raises(DeadLetterError, match="not delivered"):
        build_app(spec).run()
    state = Checkpoint(spec["checkpoint"]).load()
    assert state["offsets"][(n["in"], 0)] <= 1200  # nothing committed past the refused letter
    paid_before = read_ledger(bs, n["ledger"], "big")
    assert len(paid_before) == 3  # steps at 500 and 1000 after the checkpoint (written at 200), 1500 paid ahead

    spec["config"]["runtime"]["dead_letter_max_bytes"] = 65_536
    app = build_app(spec)
    app.run()
    letters = [dead_letter_from_record(r) for r in read_topic(bs, n["dlq"])]
    (letter,) = [d for d in letters if d["length"] == len(huge)]
    assert letter["truncated"] and letter["value"] == huge[:65_536]
    assert letter["sha256"] == hashlib.sha256(huge).hexdigest()
    assert app.stats.skipped_steps == 3  # the replay does not pay again at 500, 1000 and 1500 (paid ahead)
    events = read_ledger(bs, n["ledger"], "big")
    # the crash cost no extra step: both lives together paid what the uninterrupted run paid (with
    # the one step each paid ahead at its end)
    assert len(events) == len(read_ledger(bs, n["ledger"], "ref")) == reference.stats.updates + 1
    assert ledger_epsilon(events) == pytest.approx(ledger_epsilon(read_ledger(bs, n["ledger"], "ref")), rel=1e-12)


def test_a_letter_the_dead_letter_topic_refuses_on_delivery_costs_no_step_on_any_restart(kafka_bootstrap):
    """A 50 kB malformed record and a dead-letter topic that takes 20 kB: the producer accepts the
    letter and the broker refuses it on delivery. Without a checkpoint, each restart re-reads the
    failing batch; it used to pay that batch's steps before the refusal surfaced (three more steps
    per restart). Confirmed before the batch is offered, the refusal stops every life first."""
    from kafka_broker import linreg_records

    bs, n = kafka_bootstrap, names()
    create_topic(bs, n["in"], partitions=1)
    create_topic(bs, n["dlq"], partitions=1, configs={"max.message.bytes": "20000"})
    values = linreg_records(4000, seed=5)
    values.insert(3500, b"{" + os.urandom(50_000))
    produce(bs, n["in"], values)
    cfg = pipeline_config(bs, input_topic=n["in"], model_topic=n["models"], dead_letter_topic=n["dlq"],
                          group_id=n["g"], reservoir=1000, batch_size=100, every_records=500,
                          noise_multiplier=2.0, epsilon=50.0, source_options={"until_end": True})
    cfg["runtime"]["poll_max_records"] = 2000
    spec = {"config": cfg, "ledger_topic": n["ledger"], "ledger_id": "dlq-refused"}
    paid = []
    for _ in range(3):
        with pytest.raises(DeadLetterError, match="not delivered"):
            build_app(spec).run()
        paid.append(len(read_ledger(bs, n["ledger"], "dlq-refused")))
    # steps at 1000, 1500, 2000 and 2500 (paid ahead) only, paid once
    assert paid[0] == 4 and paid == [paid[0]] * 3


def read_ledger(bs: str, topic: str, name: str) -> list:
    from connectors.kafka import KafkaLedger

    led = KafkaLedger(bs, topic, name=name, create_topic=False, **WEAK_LEDGER)
    try:
        return led.events()
    finally:
        led.close()


def test_sigterm_writes_the_last_checkpoint_whatever_the_interval(kafka_bootstrap, tmp_path):
    """SIGTERM with a 10 s checkpoint interval: the final checkpoint and commit are written, so
    the restart re-reads nothing."""
    bs, n = kafka_bootstrap, names()
    create_topic(bs, n["in"], partitions=2)
    produce(bs, n["in"], id_records(3000), partitions=2)
    cfg = config(bs, n, source_options={"until_end": False})
    consumed = tmp_path / "consumed.txt"
    spec = {"config": cfg, "ledger_topic": n["ledger"], "ledger_id": "term", "checkpoint": str(tmp_path / "c.npz"),
            "checkpoint_interval_s": 10.0, "consumed_log": str(consumed)}
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)]),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

    def life(wait_s: float = 60.0) -> list[str]:
        start = consumed.read_text().splitlines() if consumed.exists() else []
        proc = subprocess.Popen([sys.executable, str(HERE / "kafka_broker.py"), str(spec_path)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # until it has read all 3000 (well inside one interval)
            if consumed.exists() and len(consumed.read_text().splitlines()) >= len(start) + 3000:
                break
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()[-3000:]
        return consumed.read_text().splitlines()[len(start):]

    first = life()
    assert len(first) == 3000
    state = Checkpoint(spec["checkpoint"]).load()
    assert state["reservoir"]["seen"] == 3000  # the final checkpoint, 10 s interval or not
    assert sum(state["offsets"].values()) == 3000
    second = life(wait_s=6.0)  # nothing new was produced: it must read nothing at all
    assert second == []
