"""No record can stop the service: arbitrary Kafka records (values of any bytes or none at all,
keys of any size, headers of any shape, any timestamp, topics the source was not given) go
through the Kafka source, decoding, the reservoir and the dead-letter path without an exception.

The consumer client is replaced at its seam (:mod:`connectors.kafka.clients`) by one that serves
generated records as kafka-python's would, so every rule above the seam runs as in production:
the source's floors and topic check, the pipeline's decoding and dead letters, and the encoding
of each letter as the Kafka dead-letter sink sends it (built into a real record batch). The
invariants: every arrival of a read topic is either accepted or dead-lettered with a reason
(a record without a value as ``tombstone``), records of other topics are never arrivals, and
every letter fits the sink's request limit.
"""

from __future__ import annotations

import json
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from connectors._lines import dead_letter_line
from connectors.kafka import kafka_python
from connectors.kafka import source as source_module
from connectors.kafka.dead_letters import MAX_REQUEST_BYTES, SIZE_MARGIN, fitted
from connectors.kafka.source import KafkaSource
from connectors.memory import MemorySink
from stream_vips.io import DeadLetter
from stream_vips.records import REASONS
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict

TOPIC = "events"
DIM = 2


class ServedConsumer:
    """A consumer client holding a fixed assignment that returns queued polls, each a list of
    ``((topic, partition), [record, ...])`` runs with kafka-python's record attributes."""

    offset_of = staticmethod(lambda r: r.offset)
    value_of = staticmethod(lambda r: r.value)

    def __init__(self, *args: Any) -> None:
        self.raw = None
        self.polls: list[list[tuple[tuple[str, int], list]]] = []
        self.committed: dict = {}

    def subscribe(self, topics: list[str], hooks: Any) -> None:
        self.topics = topics

    def fetch(self, max_records: int, timeout_s: float) -> list:
        return self.polls.pop(0) if self.polls else []

    def origin(self, topic: str, partition: int) -> Any:
        return partial(kafka_python.record_origin, topic, partition)

    def assignment(self) -> set:
        return {(TOPIC, 0), (TOPIC, 1)}

    def paused(self) -> set:
        return set()

    def pause(self, tps: Any) -> None: ...

    def resume(self, tps: Any) -> None: ...

    def commit(self, offsets: dict, timeout_s: float) -> None:
        self.committed.update(offsets)

    def seek(self, tp: Any, offset: int) -> None: ...

    def highwater(self, tp: Any) -> int | None:
        return None

    def at_end(self, tps: set, floors: dict) -> bool:
        return not self.polls

    def keepalive(self) -> None: ...

    def close(self) -> None: ...


class EncodingDeadLetters:
    """Keeps every letter after encoding it exactly as the Kafka and JSONL sinks would."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []

    def send(self, letters: list[DeadLetter]) -> None:
        for letter in letters:
            value, key, headers = fitted(letter)
            assert value is not None or key is not None  # a Kafka record needs one of them
            builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                                producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                                batch_size=MAX_REQUEST_BYTES)
            builder.append(0, timestamp=None, key=key, value=value, headers=headers)
            assert builder.size() <= MAX_REQUEST_BYTES - SIZE_MARGIN
            json.loads(dead_letter_line(letter))
        self.letters.extend(letters)

    def flush(self) -> None: ...

    def close(self) -> None: ...


def json_record() -> st.SearchStrategy[bytes]:
    finite = st.floats(-3, 3, allow_nan=False)
    good = st.builds(lambda x, y: {"x": x, "y": y}, st.lists(finite, min_size=DIM, max_size=DIM), finite)
    odd = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                       lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids,
                                                                                 max_size=4), max_leaves=12)
    doc = st.one_of(good, good.map(lambda r: {**r, "user": "u1"}), odd)
    return doc.map(lambda d: json.dumps(d, allow_nan=True).encode())


values = st.one_of(st.none(), st.just(b""), st.binary(max_size=300), json_record(),
                   st.integers(70_000, 200_000).map(lambda n: b'{"x": [' + b"1," * n + b"1]}"))
keys = st.one_of(st.none(), st.binary(max_size=3000), st.text(max_size=50).map(str.encode))
header_values = st.one_of(st.none(), st.binary(max_size=200))
headers = st.lists(st.tuples(st.text(max_size=30), header_values), max_size=4)
records = st.lists(st.tuples(values, keys, headers, st.integers(-1, 2**62), st.sampled_from([TOPIC, "other"]),
                             st.sampled_from([0, 1])), max_size=30)


def served_polls(recs: list[tuple]) -> list[list[tuple[tuple[str, int], list]]]:
    """One poll of ``recs`` grouped in runs per partition, offsets increasing per partition."""
    nxt: dict[tuple[str, int], int] = {}
    runs: list[tuple[tuple[str, int], list]] = []
    for value, key, hdrs, timestamp, topic, partition in recs:
        tp = (topic, partition)
        offset = nxt.get(tp, 0)
        nxt[tp] = offset + 1
        rec = SimpleNamespace(value=value, key=key, headers=hdrs, timestamp=timestamp, offset=offset)
        if runs and runs[-1][0] == tp:
            runs[-1][1].append(rec)
        else:
            runs.append((tp, [rec]))
    return [runs]


def application(tmp_path: Any, monkeypatch: Any, mode: str) -> tuple[Application, KafkaSource]:
    client = ServedConsumer()
    monkeypatch.setattr(source_module, "consumer_client", lambda *args: client)
    monkeypatch.setattr(source_module, "check_access", lambda *args, **kw: None)  # no broker to ask
    privacy: dict[str, Any] = {"epsilon": 10.0, "delta": 1e-5, "noise_multiplier": 4.0, "seed": 3,
                               "ledger": {"type": "memory"}}
    sampling: dict[str, Any] = {"method": "fixed", "reservoir": 20, "batch_size": 5}
    if mode == "admitted":
        sampling["validation"] = "admitted"
    elif mode == "message_key":
        privacy.update(unit="key", max_records_per_key=2)
    elif mode == "key_field":
        privacy.update(unit="key", max_records_per_key=2, key_field="user")
    cfg = config_from_dict({
        "model": {"family": "linreg", "params": {"dim": DIM, "y_bound": 2.0}},
        "privacy": privacy, "sampling": sampling, "schedule": {"every_records": 10, "tau0": 1.0},
        "metrics": {"enabled": False}, "runtime": {"on_halt": "exit", "poll_timeout_s": 0.0},
    }, env={})
    source = KafkaSource(topics=TOPIC, bootstrap_servers="127.0.0.1:1", commit_interval_s=0.0, until_end=True)
    app = Application.from_config(cfg, source=source, sink=MemorySink(), dead_letter=EncodingDeadLetters())
    return app, source


@pytest.mark.parametrize("mode", ["record", "admitted", "message_key", "key_field"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(recs=records)
def test_no_record_stops_the_pipeline(tmp_path, monkeypatch, mode, recs):
    app, source = application(tmp_path, monkeypatch, mode)
    try:
        source._client.polls = served_polls(recs)
        raws = app._take_new(source.poll(1000, 0.0))
        app.ingest(raws)
        app._commit()
    finally:
        source.close()
        app.learner.close()
    read = [r for r in recs if r[4] == TOPIC]
    letters = app.dead_letter.letters
    assert app.stats.records == len(read) == len(raws)  # other topics never arrive
    assert source.unexpected_dropped == len(recs) - len(read)
    assert all(letter.reason in REASONS or letter.reason == "missing_key" for letter in letters)
    assert sum(app.stats.rejected.values()) == len(letters)
    tombstones = [r for r in read if r[0] is None]
    if mode != "admitted":  # admitted validation reads (and rejects) only the arrivals admitted
        assert app.stats.accepted + len(letters) == len(read)
        assert sum(letter.reason in ("tombstone", "missing_key") for letter in letters) >= len(tombstones)
        if mode == "record":
            assert sum(letter.reason == "tombstone" for letter in letters) == len(tombstones)
    for letter in letters:
        assert (letter.record.value is None) == (letter.reason == "tombstone" or letter.record.value is None)
        if letter.record.value is None:
            assert letter.length is None and letter.sha256 is None and not letter.truncated


def test_a_tombstone_alone_is_a_dead_letter_and_the_run_goes_on(tmp_path, monkeypatch):
    """The defect: one tombstone stopped the service with exit 4 at every restart."""
    app, source = application(tmp_path, monkeypatch, "record")
    good = json.dumps({"x": [0.1, 0.2], "y": 0.3}).encode()
    source._client.polls = served_polls([(None, b"k", [], 0, TOPIC, 0)] + [(good, None, [], 0, TOPIC, 0)] * 30)
    stats = app.run()
    letters = app.dead_letter.letters
    assert [(letter.reason, letter.record.origin["offset"]) for letter in letters] == [("tombstone", 0)]
    assert stats.records == 31 and stats.accepted == 30 and stats.updates >= 1
    assert source._client.committed[(TOPIC, 0)] == 31  # committed past the letter, which was confirmed
