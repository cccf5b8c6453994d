"""Kafka connectors against the real broker: source, model sink, dead letters, ledger, reader."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from kafka import KafkaAdminClient

from connectors.kafka import (
    KafkaConnectorError,
    KafkaDeadLetterSink,
    KafkaLedger,
    KafkaModelSink,
    KafkaPublishError,
    KafkaSource,
    Reassembler,
    chunk_payload,
    dead_letter_from_record,
    read_topic,
    security_options,
)
from kafka_broker import CLIENTS, SASL_PASSWORD, SASL_USER, WEAK_LEDGER, create_topic, produce, unique_topic
from stream_vips import messages
from stream_vips.client import ModelReader, RiverRegressor, SchemaVersionError, check_message
from stream_vips.io import DeadLetter, RawRecord
from stream_vips.models.linreg import LinearRegression
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import LedgerCorrupt

pytestmark = pytest.mark.kafka
each_client = pytest.mark.parametrize("client", CLIENTS)


def _drain(source: KafkaSource, n: int, max_records: int = 1000, timeout_s: float = 30.0) -> list[RawRecord]:
    out: list[RawRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        batch = source.poll(max_records, 0.5)
        assert len(batch) <= max_records
        out.extend(batch)
    return out


def _committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(group)[group]
        return {(tp.topic, tp.partition): om.offset for tp, om in offsets.items() if om.offset >= 0}
    finally:
        admin.close()


@each_client
def test_source_bounded_polls_manual_commits_and_resume_from_commit(kafka_bootstrap, client):
    topic = create_topic(kafka_bootstrap, unique_topic("src"), partitions=3)
    produce(kafka_bootstrap, topic, [json.dumps({"i": i}).encode() for i in range(60)], partitions=3)
    group = unique_topic("g")
    src = KafkaSource(kafka_bootstrap, topic, group_id=group, client=client)
    got = _drain(src, 40, max_records=7)
    assert len(got) >= 40
    assert {r.origin["partition"] for r in got} <= {0, 1, 2}
    src.commit()
    expected = {}
    for r in got:
        key = (r.origin["topic"], r.origin["partition"])
        expected[key] = max(expected.get(key, 0), r.origin["offset"] + 1)
    assert src.positions() == expected
    lag = src.lag()
    assert sum(lag.values()) == 60 - len(got)
    assert all(lag[k] == 20 - expected.get(k, 0) for k in lag)
    src.close()
    assert _committed(kafka_bootstrap, group) == expected

    # a new member of the group continues exactly after the committed offsets
    src2 = KafkaSource(kafka_bootstrap, topic, group_id=group, until_end=True, client=client)
    rest = []
    while not src2.exhausted:
        rest.extend(src2.poll(1000, 0.5))
    src2.close()
    seen = sorted((r.origin["partition"], r.origin["offset"]) for r in got + rest)
    assert seen == sorted((p, o) for p in range(3) for o in range(20))


@each_client
def test_commits_at_most_every_interval_and_always_on_pause_idle_and_close(kafka_bootstrap, client):
    topic = create_topic(kafka_bootstrap, unique_topic("ival"), partitions=1)
    produce(kafka_bootstrap, topic, [json.dumps({"i": i}).encode() for i in range(30)])
    group = unique_topic("g")
    src = KafkaSource(kafka_bootstrap, topic, group_id=group, commit_interval_s=600.0, client=client)
    first = _drain(src, 5, max_records=5)
    src.commit()  # the first commit is immediate
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 5} == src.positions()
    more = _drain(src, 5, max_records=5)
    src.commit()  # within the interval: marked processed, not sent
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 5}
    src.commit_now()
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 10}
    _drain(src, 5, max_records=5)
    src.commit()
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 10}
    src.pause()  # halting commits what was processed; while paused commit() is immediate
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 15}
    src.resume()
    _drain(src, 5, max_records=5)
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 15}  # returned, never marked processed
    src.commit()
    src.close()  # close commits what was marked processed
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 20}
    assert [r.origin["offset"] for r in first + more] == list(range(10))

    # an idle poll commits marked offsets once the interval has passed
    src = KafkaSource(kafka_bootstrap, topic, group_id=group, commit_interval_s=0.5, client=client)
    _drain(src, 5, max_records=5)
    src.commit()
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 25}
    _drain(src, 5, max_records=5)
    src.commit()  # marked, but the interval has not passed
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 25}
    time.sleep(0.6)
    assert src.poll(10, 0.1) == []
    assert _committed(kafka_bootstrap, group) == {(topic, 0): 30}
    src.close()
    with pytest.raises(KafkaConnectorError, match="commit_interval_s"):
        KafkaSource(kafka_bootstrap, topic, commit_interval_s=-1, client=client)


@each_client
def test_long_update_pauses_partitions_and_keeps_the_member_alive(kafka_bootstrap, client):
    topic = create_topic(kafka_bootstrap, unique_topic("long"), partitions=2)
    produce(kafka_bootstrap, topic, [b'{"a":1}'] * 20, partitions=2)
    group = unique_topic("g")
    src = KafkaSource(kafka_bootstrap, topic, group_id=group, max_poll_interval_ms=6000,  # librdkafka: >= session
                      session_timeout_ms=6000, heartbeat_interval_ms=1000, long_update_s=0.5, client=client)
    assignments = []
    assigned = src.assigned
    src.assigned = lambda tps: (tps and assignments.append(set(tps)), assigned(tps))[1]  # the client's hook
    got = _drain(src, 5, max_records=5)
    assert got and len(assignments) == 1
    time.sleep(7.0)  # an update longer than max.poll.interval.ms: without keep-alive polls the member is evicted
    assert src.paused_partitions() == {(topic, 0), (topic, 1)}
    src.commit()
    assert _committed(kafka_bootstrap, group) == src.positions()
    more = _drain(src, 20 - len(got))
    assert not src.paused_partitions()
    assert len(assignments) == 1  # no rebalance happened
    assert len(got) + len(more) == 20
    src.close()


@each_client
def test_rebalance_hands_over_exactly_the_processed_records(kafka_bootstrap, client):
    """A member that marked records processed but has not committed them yet (commit interval)
    commits them when its partitions are revoked, on the consumer's IO thread, after finishing
    the batch it still has in flight through ``before_revoke`` (as the pipeline does with a
    decode worker). The two members together then see every record exactly once."""
    topic = create_topic(kafka_bootstrap, unique_topic("rebal"), partitions=4)
    produce(kafka_bootstrap, topic, [json.dumps({"i": i}).encode() for i in range(2000)], partitions=4)
    group = unique_topic("g")
    fast = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, "commit_interval_s": 3600.0}
    a = KafkaSource(kafka_bootstrap, topic, group_id=group, **fast, client=client)
    seen_a: list = []
    flight: dict = {"records": [], "positions": None, "revoked_at": None}

    def finish() -> dict | None:  # runs on the IO thread while poll() holds the source's lock
        seen_a.extend(flight["records"])
        flight["records"] = []
        flight["revoked_at"] = flight["positions"]
        return flight["positions"]

    def step(batch) -> None:  # the previous batch is processed; this one goes in flight
        seen_a.extend(flight["records"])
        if flight["positions"] is not None:
            a.commit(flight["positions"])  # marked only: the interval has not passed
        flight["records"], flight["positions"] = list(batch), a.positions()

    a.before_revoke = finish
    deadline = time.monotonic() + 60
    while len(seen_a) < 100 and time.monotonic() < deadline:
        step(a.poll(20, 0.5))
    b = KafkaSource(kafka_bootstrap, topic, group_id=group, **fast, client=client)
    seen_b: list = []
    while flight["revoked_at"] is None and time.monotonic() < deadline:
        seen_b.extend(b.poll(20, 0.1))
        batch = a.poll(20, 0.1)
        if flight["revoked_at"] is None and batch:
            step(batch)
        else:
            seen_a.extend(batch)  # returned after the revocation: processed as usual
    assert flight["revoked_at"] is not None, "partitions were never revoked"
    a.before_revoke = None
    assert _committed(kafka_bootstrap, group) == flight["revoked_at"]
    while len(seen_a) + len(seen_b) < 2000 and time.monotonic() < deadline:
        for src, seen in ((a, seen_a), (b, seen_b)):
            seen.extend(src.poll(100, 0.2))
            src.commit()
    values = sorted(json.loads(r.value)["i"] for r in seen_a + seen_b)
    assert values == list(range(2000))
    a.close()
    b.close()


@each_client
def test_pause_on_halt_stops_delivery_until_resume(kafka_bootstrap, client):
    topic = create_topic(kafka_bootstrap, unique_topic("halt"), partitions=1)
    src = KafkaSource(kafka_bootstrap, topic, group_id=unique_topic("g"), group_instance_id="pipeline-0", client=client)
    assert src.poll(10, 1.0) == []  # joins the group (static member) and gets the partition
    src.pause()
    produce(kafka_bootstrap, topic, [b"1", b"2", b"3"])
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert src.poll(10, 0.3) == []
    src.resume()
    assert [r.value for r in _drain(src, 3)] == [b"1", b"2", b"3"]
    src.close()


@each_client
def test_sasl_settings_from_environment(kafka_broker, monkeypatch, client):
    topic = create_topic(kafka_broker.bootstrap, unique_topic("sasl"))
    produce(kafka_broker.bootstrap, topic, [b"secret-ok"])
    monkeypatch.setenv("STREAM_VIPS_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("STREAM_VIPS_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("STREAM_VIPS_KAFKA_SASL_USERNAME", SASL_USER)
    monkeypatch.setenv("STREAM_VIPS_KAFKA_SASL_PASSWORD", SASL_PASSWORD)
    src = KafkaSource(kafka_broker.sasl_bootstrap, topic, group_id=unique_topic("g"), client=client)
    assert [r.value for r in _drain(src, 1)] == [b"secret-ok"]
    src.close()
    monkeypatch.delenv("STREAM_VIPS_KAFKA_SASL_PASSWORD")
    with pytest.raises(KafkaConnectorError, match="sasl_password"):
        KafkaSource(kafka_broker.sasl_bootstrap, topic, client=client)


def test_security_options_prefer_explicit_values_and_reject_unknown_protocols():
    env = {"STREAM_VIPS_KAFKA_SECURITY_PROTOCOL": "SSL", "STREAM_VIPS_KAFKA_SSL_CAFILE": "/env/ca.pem"}
    assert security_options({"ssl_cafile": "/cfg/ca.pem"}, env) == {"security_protocol": "SSL",
                                                                    "ssl_cafile": "/cfg/ca.pem"}
    assert security_options({}, {}) == {"security_protocol": "PLAINTEXT"}
    with pytest.raises(KafkaConnectorError, match="security_protocol"):
        security_options({"security_protocol": "TLS"}, {})


def _linreg_message(model_id: str, version: int, dim: int = 3, seed: int = 0) -> dict:
    model = LinearRegression(dim=dim, dataset_size=100)
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(dim, dim))
    model.load_state({"precision": a @ a.T + dim * np.eye(dim), "shift": rng.normal(size=dim)})
    report = messages.privacy_report(epsilon_spent=0.1 * (version + 1), delta=1e-5, epsilon_budget=1.0,
                                     accountant="pld", sampling="poisson", q=0.1, noise_multiplier=1.0,
                                     steps=version + 1, halted=False, seeded=True)
    return messages.build_message(model_id, "linreg", model.hyperparameters(), version, model.state(), report), model


@each_client
def test_model_sink_compacted_topic_and_reader_keeps_latest_per_id(kafka_bootstrap, client):
    topic = unique_topic("models")
    sink = KafkaModelSink(kafka_bootstrap, topic, partitions=2, client=client)
    for v in range(3):
        for mid in ("a", "b"):
            sink.publish(mid, _linreg_message(mid, v, seed=v)[0])
    sink.close()
    with ModelReader(kafka_bootstrap, topic) as reader:
        read, deadline = 0, time.monotonic() + 10  # commit markers land just after the producer's commit
        while read < 6 and time.monotonic() < deadline:
            read += reader.poll()
        assert read == 6
        latest = reader.latest()
        assert {k: m["version"] for k, m in latest.items()} == {"a": 2, "b": 2}
        post = reader.posterior("a")
        with pytest.raises(KeyError, match="no model 'c'"):
            reader.posterior("c", wait_s=0.3)
    expected = _linreg_message("a", 2, seed=2)[1]
    X = np.array([[0.1, -0.2, 0.3], [0.5, 0.0, -0.5]])
    np.testing.assert_allclose(post.model.predictive(X)[0], expected.predictive(X)[0], rtol=1e-12)
    np.testing.assert_allclose(post.model.predictive(X)[1], expected.predictive(X)[1], rtol=1e-12)
    assert post.epsilon_spent == pytest.approx(0.3)
    reg = RiverRegressor(post, ["f0", "f1", "f2"])
    assert reg.predict_one({"f0": 0.1, "f1": -0.2, "f2": 0.3}) == pytest.approx(expected.predictive(X[:1])[0][0])


def test_existing_topic_with_incompatible_settings_is_refused(kafka_bootstrap):
    topic = create_topic(kafka_bootstrap, unique_topic("wrong"), configs={"cleanup.policy": "delete"})
    with pytest.raises(KafkaConnectorError, match="cleanup.policy='delete'"):
        KafkaModelSink(kafka_bootstrap, topic)
    with pytest.raises(KafkaConnectorError, match="does not exist"):
        KafkaModelSink(kafka_bootstrap, unique_topic("absent"), create_topic=False)
    # one replica, two required in sync: every acks=all write would fail (a service would pay a
    # step and fail to publish it at every restart)
    topic = create_topic(kafka_bootstrap, unique_topic("insync"), configs={"min.insync.replicas": "2"})
    with pytest.raises(KafkaConnectorError, match=r"1 replica\(s\) on some partition but min.insync.replicas=2"):
        KafkaModelSink(kafka_bootstrap, topic)


@each_client
def test_model_over_the_broker_limit_is_chunked_and_reassembled(kafka_bootstrap, client):
    topic = unique_topic("big")
    sink = KafkaModelSink(kafka_bootstrap, topic, client=client)  # default max.message.bytes = 1 MiB
    msg, model = _linreg_message("big", 0, dim=400, seed=1)  # 400x400 float64 noise: ~1.7 MB of JSON
    payload = messages.dumps(msg)
    assert len(payload) > 1_048_576
    sink.publish("big", msg)
    assert sink.chunked_messages == 1
    sink.close()
    records = read_topic(kafka_bootstrap, topic)
    assert len(records) == len(chunk_payload(payload, sink.chunk_bytes)) >= 2
    assert all(len(r.value) <= sink.max_message_bytes for r in records)
    with ModelReader(kafka_bootstrap, topic) as reader:
        post = reader.posterior("big", wait_s=10.0)
    np.testing.assert_array_equal(post.model.state()["precision"], model.state()["precision"])


def test_reassembler_refuses_missing_chunks_and_bad_checksums():
    r = Reassembler()

    def h(i: int, n: int, d: str = "00") -> list[tuple[str, bytes]]:
        return [("stream-vips-chunk", f"{i}/{n}".encode()), ("stream-vips-message-id", b"m"),
                ("stream-vips-sha256", d.encode())]

    assert r.add(b"k#chunk-0", b"ab", h(0, 3)) is None
    with pytest.raises(KafkaConnectorError, match="1 of 3 chunks missing"):
        r.add(b"k", b"cd", h(2, 3))
    assert r.add(b"k#chunk-0", b"ab", h(0, 2)) is None
    with pytest.raises(KafkaConnectorError, match="sha256"):
        r.add(b"k", b"cd", h(1, 2, "not-the-digest"))
    assert r.add(b"k", b"whole", None) == ("k", b"whole")


def test_reader_refuses_unknown_schema_version():
    msg = _linreg_message("m", 0)[0]
    with pytest.raises(SchemaVersionError, match="schema_version 2"):
        check_message({**msg, "schema_version": 2})


@each_client
def test_dead_letters_keep_original_bytes_reason_and_origin(kafka_bootstrap, client):
    topic = unique_topic("dlq")
    sink = KafkaDeadLetterSink(kafka_bootstrap, topic, client=client)
    raw = RawRecord(b"\xff not json", {"topic": "in", "partition": 2, "offset": 41})
    sink.send([DeadLetter(raw, "invalid_json", "Expecting value")])
    sink.close()
    (rec,) = read_topic(kafka_bootstrap, topic)
    assert rec.key == b"in/2/41"
    assert dead_letter_from_record(rec) == {
        "value": b"\xff not json", "reason": "invalid_json", "detail": "Expecting value",
        "source": {"topic": "in", "partition": "2", "offset": "41"}}


@each_client
def test_ledger_replays_fences_older_writers_and_refuses_gaps(kafka_bootstrap, client):
    topic = unique_topic("ledger")
    events = [SubsampledGaussianEvent(noise_multiplier=1.0 + i, sampling_rate=0.1, sampling="poisson")
              for i in range(3)]
    first = KafkaLedger(kafka_bootstrap, topic, ledger_id="m1", **WEAK_LEDGER, client=client)
    assert [first.append(e) for e in events] == [0, 1, 2]
    # another model's ledger on the same topic
    other = KafkaLedger(kafka_bootstrap, topic, ledger_id="m2", **WEAK_LEDGER, client=client)
    assert other.events() == [] and other.append(events[0]) == 0
    other.close()

    # a restart: replays and fences `first`
    second = KafkaLedger(kafka_bootstrap, topic, ledger_id="m1", **WEAK_LEDGER, client=client)
    assert second.events() == events
    with pytest.raises(KafkaPublishError,
                       match="'m1' on topic .* was opened by another process, which fenced this one"):
        first.append(events[0])
    with pytest.raises(KafkaPublishError, match="refused further appends"):
        first.append(events[0])
    assert second.append(events[1]) == 3
    second.close()
    replayed = KafkaLedger(kafka_bootstrap, topic, ledger_id="m1", **WEAK_LEDGER, client=client).events()
    assert replayed == events + [events[1]]

    # a gap in the steps (a lost event) is refused rather than under-counted
    from kafka import KafkaProducer

    from stream_vips.privacy.ledger import encode_line

    prod = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    prod.send(topic, key=b"m2/000000000002", value=encode_line(2, events[0]).rstrip(b"\n")).get(10)
    # steps without their genesis and their start: a topic deleted and recreated under a writer
    prod.send(topic, key=b"m3/000000000003", value=encode_line(3, events[0]).rstrip(b"\n")).get(10)
    prod.close()
    with pytest.raises(LedgerCorrupt, match="step 2 where 1 was expected"):
        KafkaLedger(kafka_bootstrap, topic, ledger_id="m2", **WEAK_LEDGER, client=client)
    with pytest.raises(LedgerCorrupt,
                       match="has no genesis and does not start at step 0: its earlier records are gone"):
        KafkaLedger(kafka_bootstrap, topic, ledger_id="m3", **WEAK_LEDGER, client=client)


def test_an_open_foreign_transaction_on_the_ledger_topic_refuses_the_replay_instead_of_shortening_it(kafka_bootstrap):
    """Another writer's open transaction (a service killed mid-append, until its
    transaction.timeout.ms) stops a read_committed reader before it, hiding every step committed
    after it: the replay used to return the steps before it, so a restart counted fewer steps
    than were paid and numbered new ones over the hidden ones. It must refuse instead; the same
    for the model topic's newest version (a version must never be reused)."""
    from kafka import KafkaProducer

    topic = unique_topic("ledger-open-txn")
    event = SubsampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.01, sampling="poisson")
    ledger = KafkaLedger(kafka_bootstrap, topic, ledger_id="svc", **WEAK_LEDGER)
    for i in range(3):
        ledger.append(event, position=i)
    models = unique_topic("models-open-txn")
    sink = KafkaModelSink(kafka_bootstrap, models)
    sink.publish("m", _linreg_message("m", 0)[0])
    other = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=unique_topic("other-writer"),
                          enable_idempotence=True, acks="all")
    other.init_transactions()
    other.begin_transaction()
    other.send(topic, key=b"other/000000000000", value=b"{}", partition=0).get(10)
    other.send(models, key=b"other", value=b"{}").get(10)
    other.flush()
    try:
        for i in range(3, 5):  # committed after the open transaction began
            ledger.append(event, position=i)
        sink.publish("m", _linreg_message("m", 1)[0])
        ledger.close()
        with pytest.raises(KafkaConnectorError, match="transaction left open by another writer"):
            KafkaLedger(kafka_bootstrap, topic, ledger_id="svc", **WEAK_LEDGER)
        with pytest.raises(KafkaConnectorError, match="transaction left open by another writer"):
            sink.latest("m")
    finally:
        other.abort_transaction()
        other.close()
        sink.close()
    reopened = KafkaLedger(kafka_bootstrap, topic, ledger_id="svc", **WEAK_LEDGER)
    assert len(reopened.events()) == 5 and reopened.append(event, position=5) == 5
    reopened.close()


def test_reading_a_topic_that_other_writers_keep_busy_with_short_transactions_succeeds(kafka_bootstrap):
    """Other services publishing on a shared topic hold transactions open most of the time but
    each one briefly: a read must wait for the ones open when it began, not refuse because a new
    one is open at the moment it checks."""
    import threading

    from kafka import KafkaProducer

    topic = create_topic(kafka_bootstrap, unique_topic("busy"), configs={"cleanup.policy": "compact"})
    stop = threading.Event()

    def writer(i: int) -> None:
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic}-w{i}",
                                 enable_idempotence=True, acks="all")
        producer.init_transactions()
        time.sleep(0.1 * i)  # staggered: at almost every moment one of them has a transaction open
        while not stop.is_set():
            producer.begin_transaction()
            producer.send(topic, b"{}", key=f"model{i}".encode(), partition=0)
            producer.flush()
            time.sleep(0.4)
            producer.commit_transaction()
            time.sleep(0.01)
        producer.close()

    writers = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(4)]
    for w in writers:
        w.start()
    try:
        time.sleep(2.0)
        counts = [len(read_topic(kafka_bootstrap, topic, timeout_s=30)) for _ in range(3)]
    finally:
        stop.set()
        for w in writers:
            w.join(10)
    assert counts[0] > 0 and counts == sorted(counts)


def test_topics_left_at_the_broker_defaults_are_checked_by_their_effective_settings(kafka_bootstrap):
    """An operator's topic with no setting of its own has the broker's defaults (min.insync.replicas
    1, max.message.bytes 1048588): kafka-python lists only settings made on the topic, which read
    as unset and refused the ledger; a real conflict is still refused."""
    plain = create_topic(kafka_bootstrap, unique_topic("ledger-default"), configs={"cleanup.policy": "compact"})
    KafkaLedger(kafka_bootstrap, plain, ledger_id="svc", **WEAK_LEDGER).close()
    models = create_topic(kafka_bootstrap, unique_topic("models-default"), configs={"cleanup.policy": "compact"})
    KafkaModelSink(kafka_bootstrap, models, max_message_bytes=1_000_000).close()
    with pytest.raises(KafkaConnectorError, match=r"max.message.bytes='1048588' \(needs '2000000'\)"):
        KafkaModelSink(kafka_bootstrap, plain, max_message_bytes=2_000_000)


def test_lost_partitions_are_not_committed(caplog):
    """After an eviction the partitions already have new owners: the listener commits nothing."""
    import asyncio

    from kafka.structs import TopicPartition

    from connectors.kafka import SeekListener

    class Evicted:
        before_revoke = None
        _polling_thread = 1

        def _pending(self):
            raise AssertionError("a lost partition must not be committed")

    with caplog.at_level("WARNING", logger="connectors.kafka"):
        asyncio.run(SeekListener(Evicted(), None).on_partitions_lost({TopicPartition("t", 3)}))
    assert "partitions lost" in caplog.text and "t/3" in caplog.text
