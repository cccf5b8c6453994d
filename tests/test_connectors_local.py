"""Embedded connectors: memory, JSONL files, stdin/stdout and the synthetic generator all follow
the stream_vips.io protocols; sinks write complete, flushed JSON lines."""

from __future__ import annotations

import io
import json
import os
import threading
import time

import numpy as np
import pytest

from connectors import DEAD_LETTER_SINKS, SINKS, SOURCES, build_connector, connector_class
from connectors.jsonl import JsonlDeadLetterSink, JsonlSink, JsonlSource
from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
from connectors.stdio import StderrDeadLetterSink, StdinSource, StdoutSink
from connectors.synthetic import SyntheticRegressionSource
from stream_vips.io import DeadLetter, RawRecord
from stream_vips.models.linreg import LinearRegression
from stream_vips.models.synthetic import MALFORMED_KINDS, fill
from stream_vips.records import decode_json


def test_registry_resolves_every_local_connector():
    for kind, registry in (("source", SOURCES), ("sink", SINKS), ("dead_letter", DEAD_LETTER_SINKS)):
        for name in registry:
            if name != "kafka":
                assert isinstance(connector_class(kind, name), type)
    with pytest.raises(KeyError, match="unknown source type"):
        connector_class("source", "pigeon")
    assert isinstance(build_connector("sink", "memory", {}), MemorySink)


def test_memory_source_queue_pause_exhaustion_and_commit():
    src = MemorySource([b"a", "b", {"c": 1}], finite=False)
    assert [r.value for r in src.poll(2, 0)] == [b"a", b"b"]
    src.pause()
    assert src.poll(10, 0) == []
    src.resume()
    assert src.poll(10, 0)[0].value == b'{"c": 1}'
    assert not src.exhausted  # open until finish()
    t0 = time.monotonic()
    assert src.poll(10, 0.05) == [] and time.monotonic() - t0 >= 0.04  # waits for records
    src.put([b"d"])
    src.finish()
    assert [r.origin["offset"] for r in src.poll(10, 0)] == [3]
    src.commit()
    assert src.exhausted and src.committed_offset == 4


def test_memory_source_wakes_up_when_records_arrive():
    src = MemorySource(finite=False)
    threading.Timer(0.05, lambda: src.put([b"x"])).start()
    assert [r.value for r in src.poll(10, 5.0)] == [b"x"]


def test_jsonl_source_lines_origins_blank_lines_and_exhaustion(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\r\n{"a": 3}')
    src = JsonlSource(str(path))
    first = src.poll(2, 0)
    assert [r.value for r in first] == [b'{"a": 1}']  # 2 lines read, one blank skipped
    assert not src.exhausted
    rest = src.poll(10, 0)
    assert [(r.value, r.origin["line"]) for r in rest] == [(b'{"a": 2}', 3), (b'{"a": 3}', 4)]
    assert src.exhausted
    src.close()


def test_jsonl_source_follow_mode_sees_appended_lines(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"1\n")
    src = JsonlSource(str(path), follow=True)
    assert [r.value for r in src.poll(10, 0)] == [b"1"]
    with open(path, "ab") as f:
        f.write(b"2\n")
    assert [r.value for r in src.poll(10, 1.0)] == [b"2"]
    assert not src.exhausted
    src.close()


def test_jsonl_sinks_write_complete_flushed_lines(tmp_path):
    sink = JsonlSink(str(tmp_path / "out" / "models.jsonl"))
    sink.publish("m", {"version": 0, "x": [1.0]})
    sink.publish("m", {"version": 1, "x": [2.0]})
    lines = (tmp_path / "out" / "models.jsonl").read_text().splitlines()  # readable before close
    assert [json.loads(x)["version"] for x in lines] == [0, 1]
    with pytest.raises(ValueError):
        sink.publish("m", {"epsilon": float("inf")})  # strict JSON: never write Infinity
    sink.close()

    dead = JsonlDeadLetterSink(str(tmp_path / "dead.jsonl"), fsync=True)
    dead.send([DeadLetter(RawRecord(b"{bad", {"offset": 4}), "invalid_json", "Expecting value"),
               DeadLetter(RawRecord(b"\xff\x00", {}), "invalid_json", "not utf-8")])
    rows = [json.loads(x) for x in (tmp_path / "dead.jsonl").read_text().splitlines()]
    assert rows[0] == {"reason": "invalid_json", "detail": "Expecting value", "origin": {"offset": 4}, "value": "{bad"}
    assert rows[1]["value_base64"] == "/wA="
    dead.close()


def test_a_bounded_letter_cuts_a_huge_key_and_value_and_still_identifies_them(tmp_path):
    """A rejected record with a 2 MB message key and a 2 MB value: the letter keeps at most
    max_bytes of the value and 1 KiB of every bytes or text origin field, each with its
    original length and sha256, so its JSON line stays small (it used to carry the whole key)."""
    import hashlib

    key, value = bytes(range(256)) * 8192, b"{" + b"v" * 2_097_151
    text = "\u00e9" * 600  # 1200 UTF-8 bytes of two-byte characters: cut at a character boundary
    raw = RawRecord(value, {"topic": "t", "partition": 0, "offset": 5, "key": key, "note": text})
    letter = DeadLetter.bounded(raw, "invalid_json", "x" * 10_000, max_bytes=65_536)
    origin = letter.record.origin
    assert letter.record.value == value[:65_536] and letter.truncated
    assert (letter.length, letter.sha256) == (len(value), hashlib.sha256(value).hexdigest())
    assert origin["key"] == key[:1024] and origin["key.length"] == len(key) == 2 * 1024 * 1024
    assert origin["key.sha256"] == hashlib.sha256(key).hexdigest()
    assert origin["note"] == "\u00e9" * 512 and origin["note.length"] == 1200
    assert origin["note.sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert (origin["topic"], origin["offset"], len(letter.detail)) == ("t", 5, 503)
    assert raw.origin["key"] is key  # the source's record is not changed
    dead = JsonlDeadLetterSink(str(tmp_path / "dead.jsonl"))
    dead.send([letter])
    dead.close()
    line = (tmp_path / "dead.jsonl").read_bytes()
    assert len(line) < 65_536 + 10_000 and json.loads(line)["origin"]["key.length"] == len(key)
    # small fields and a value under the cap are kept whole, with nothing added
    small = DeadLetter.bounded(RawRecord(b"{", {"key": b"k" * 1024, "note": "n"}), "invalid_json", "d", 65_536)
    assert small.record.origin == {"key": b"k" * 1024, "note": "n"} and not small.truncated


def test_stdin_source_honours_timeouts_and_reaches_eof():
    r, w = os.pipe()
    reader = os.fdopen(r, "rb")
    src = StdinSource(reader)
    t0 = time.monotonic()
    assert src.poll(10, 0.05) == [] and time.monotonic() - t0 < 2
    os.write(w, b'{"a": 1}\n\n{"a": 2}\n')
    os.close(w)
    got = []
    deadline = time.monotonic() + 5
    while not src.exhausted and time.monotonic() < deadline:
        got += src.poll(10, 0.1)
    assert [x.value for x in got] == [b'{"a": 1}', b'{"a": 2}'] and src.exhausted


def test_stdout_and_stderr_sinks_write_json_lines():
    out, err = io.StringIO(), io.StringIO()
    StdoutSink(out).publish("m", {"version": 3})
    StderrDeadLetterSink(err).send([DeadLetter(RawRecord(b"x"), "invalid_json", "d")])
    assert json.loads(out.getvalue()) == {"version": 3}
    assert json.loads(err.getvalue())["reason"] == "invalid_json"


def test_default_std_streams_are_looked_up_at_each_write(capsys):
    out, err = StdoutSink(), StderrDeadLetterSink()
    out.publish("m", {"version": 4})
    err.send([DeadLetter(RawRecord(b"\xff"), "invalid_json", "d")])
    err.send([])  # no letters, no output
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"version": 4}
    assert json.loads(captured.err)["value_base64"] == "/w=="
    with pytest.raises(ValueError):  # the message format forbids NaN: never a half-valid line
        out.publish("m", {"v": float("nan")})
    assert capsys.readouterr().out == ""


def test_every_line_source_returns_nothing_while_paused(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    r, w = os.pipe()
    os.write(w, b'{"a": 1}\n')
    os.close(w)
    sources = [JsonlSource(str(path)), StdinSource(os.fdopen(r, "rb")), SyntheticRegressionSource(count=1),
               MemorySource([b"{}"])]
    for src in sources:
        src.pause()
        assert src.paused and src.poll(10, 0.01) == []
        src.resume()
        got: list[RawRecord] = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got = src.poll(10, 0.05)
        assert len(got) == 1, type(src).__name__
        src.close()


def test_memory_sinks_keep_what_they_receive():
    sink, dead = MemorySink(), MemoryDeadLetterSink()
    sink.publish("k", {"v": 1})
    dead.send([DeadLetter(RawRecord(b"x"), "r", "d")])
    sink.close()
    assert sink.messages == [("k", {"v": 1})] and len(dead.letters) == 1
    with pytest.raises(RuntimeError):
        sink.publish("k", {})


def test_synthetic_records_follow_the_configured_linear_model():
    d, n, noise = 4, 20_000, 0.1
    w = np.array([1.0, -2.0, 0.5, 0.0])
    src = SyntheticRegressionSource(count=n, dimension=d, weights=w, noise_std=noise, x_scale=0.5, seed=3)
    raws = []
    while not src.exhausted:
        raws += src.poll(3_000, 0)
    assert len(raws) == n and [r.origin["offset"] for r in raws[:3]] == [0, 1, 2]
    objs = decode_json([r.value for r in raws]).values
    X = np.array([o["x"] for o in objs])
    y = np.array([o["y"] for o in objs])
    # E|x|^2 = x_scale^2; least squares recovers w with standard error ~ noise / (sqrt(n) * 0.5 / sqrt(d)).
    assert np.mean(np.sum(X**2, axis=1)) == pytest.approx(0.25, rel=0.02)
    se = noise / (np.sqrt(n) * 0.5 / np.sqrt(d))
    w_hat = np.linalg.lstsq(X, y, rcond=None)[0]
    assert np.max(np.abs(w_hat - w)) < 5 * se
    assert np.std(y - X @ w) == pytest.approx(noise, rel=0.03)


def test_synthetic_is_deterministic_and_malformed_fraction_is_binomial():
    a = SyntheticRegressionSource(count=500, seed=9, malformed_fraction=0.2)
    b = SyntheticRegressionSource(count=500, seed=9, malformed_fraction=0.2)
    va, vb = [r.value for r in a.poll(500, 0)], [r.value for r in b.poll(500, 0)]
    assert va == vb
    decoded = decode_json(va)
    parsed = LinearRegression(dim=5, dataset_size=10).parse_batch(decoded.values)
    n_bad = len(va) - len(parsed.accepted)
    # Binomial(500, 0.2): mean 100, sd ~ 8.9.
    assert abs(n_bad - 100) < 5 * 8.95
    # Exactly the malformed lines are rejected, and every kind occurs.
    templates = {fill(t, 5).encode() for t in MALFORMED_KINDS.values()}
    assert sum(v in templates for v in va) == n_bad
    assert {v for v in va if v in templates} == templates


def test_synthetic_rate_limit_and_validation():
    src = SyntheticRegressionSource(count=None, records_per_second=200.0)
    time.sleep(0.1)
    got = len(src.poll(10_000, 0.0))
    assert 5 <= got <= 60  # ~20 due after 0.1 s, never the 10000 asked for
    assert not src.exhausted
    for bad in ({"dimension": 0}, {"malformed_fraction": 2.0}, {"weights": [1.0]}, {"count": -1}):
        with pytest.raises(ValueError):
            SyntheticRegressionSource(**bad)
