"""Ledgers: durable append, replay, torn-tail recovery, corruption refusal, SIGKILL crashes."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import (
    FileLedger,
    Ledger,
    LedgerCorrupt,
    LedgerLocked,
    LedgerMismatch,
    MemoryLedger,
    check_binding,
    encode_genesis,
    encode_line,
    new_genesis,
)

ROOT = Path(__file__).resolve().parents[1]


def ev(i: int) -> SubsampledGaussianEvent:
    return SubsampledGaussianEvent(1.0 + i / 100, 0.1, "poisson")


def test_memory_ledger_protocol():
    led = MemoryLedger()
    assert isinstance(led, Ledger)
    assert [led.append(ev(i)) for i in range(3)] == [0, 1, 2]
    assert led.events() == [ev(0), ev(1), ev(2)]


def test_file_ledger_replays_in_order(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with FileLedger(path) as led:
        assert isinstance(led, Ledger)
        assert [led.append(ev(i)) for i in range(5)] == list(range(5))
    with FileLedger(path) as led:
        assert led.events() == [ev(i) for i in range(5)]
        assert led.append(ev(5)) == 5
    assert len(path.read_bytes().splitlines()) == 7  # the genesis and six events


def test_genesis_gives_each_ledger_a_stable_random_id(tmp_path):
    with FileLedger(tmp_path / "a.jsonl") as a, FileLedger(tmp_path / "b.jsonl") as b:
        first_id = a.ledger_id
        assert a.ledger_id != b.ledger_id and len(a.ledger_id) == 32
        assert a.supersedes == () and a.last_position is None
        a.append(ev(0), position=1000)
        a.append(ev(1), position=2000)
    with FileLedger(tmp_path / "a.jsonl") as a:
        assert a.ledger_id == first_id
        assert a.last_position == 2000
    assert MemoryLedger().ledger_id != MemoryLedger().ledger_id


def test_positions_are_covered_by_the_checksum(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with FileLedger(path) as led:
        led.append(ev(0), position=10)
        led.append(ev(1), position=20)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"at":10', b'"at":99')
    path.write_bytes(b"".join(lines))
    with pytest.raises(LedgerCorrupt, match="line 2 is corrupt: checksum"):
        FileLedger(path)


def test_torn_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "ledger.jsonl"
    with FileLedger(path) as led:
        led.append(ev(0))
        led.append(ev(1))
    whole = path.read_bytes()
    path.write_bytes(whole + encode_line(2, ev(2))[:37])  # crash mid-write
    with caplog.at_level(logging.WARNING), FileLedger(path) as led:
        assert led.events() == [ev(0), ev(1)]
        assert "torn last line 4" in caplog.text
        assert path.read_bytes() == whole  # cut, so the next append starts a clean line
        assert led.append(ev(2)) == 2
    with FileLedger(path) as led:
        assert led.events() == [ev(0), ev(1), ev(2)]


def test_complete_last_line_with_bad_checksum_is_corruption_not_a_torn_write(tmp_path):
    """A line that ends in its newline was written whole: if it fails its checksum it was
    changed afterwards. Cutting it would under-count and delete the evidence."""
    path = tmp_path / "ledger.jsonl"
    changed = encode_line(1, ev(1)).replace(b'"count":1', b'"count":9')
    data = encode_genesis(new_genesis()) + encode_line(0, ev(0)) + changed
    path.write_bytes(data)
    with pytest.raises(LedgerCorrupt, match="line 3 is corrupt: checksum"):
        FileLedger(path)
    assert path.read_bytes() == data  # nothing cut


def test_binding_refuses_state_of_another_or_a_rolled_back_ledger(tmp_path):
    led = MemoryLedger()
    for i in range(3):
        led.append(ev(i))
    check_binding(led, "checkpoint", led.ledger_id, 3)  # all three steps are held
    check_binding(led, "model", led.ledger_id, 1)
    with pytest.raises(LedgerMismatch, match="holds only 3: the ledger was rolled back"):
        check_binding(led, "model", led.ledger_id, 4)
    with pytest.raises(LedgerMismatch, match="deleted or replaced"):
        check_binding(led, "checkpoint", "0" * 32, 1)
    with pytest.raises(LedgerMismatch, match="names no ledger id"):
        check_binding(led, "checkpoint", None, 1)
    with FileLedger(tmp_path / "reset.jsonl", supersedes=["0" * 32]) as reset:
        check_binding(reset, "checkpoint", "0" * 32, 59)  # a deliberate reset accepts the old state
        with pytest.raises(LedgerMismatch):
            check_binding(reset, "checkpoint", "1" * 32, 1)


@pytest.mark.parametrize("damage, why", [
    (lambda lines: lines.__setitem__(1, lines[1].replace(b'"count":1', b'"count":2')), "checksum"),
    (lambda lines: lines.__setitem__(1, b"{not json"), "not JSON"),
    (lambda lines: lines.__setitem__(1, encode_line(5, ev(1)).rstrip(b"\n")), "step 5"),
    (lambda lines: lines.__setitem__(1, b""), "not JSON"),
    (lambda lines: lines.__setitem__(1, b'{"a": 1}'), "not a ledger line"),
])
def test_corruption_before_the_last_line_refuses_to_open(tmp_path, damage, why):
    path = tmp_path / "ledger.jsonl"
    lines = [encode_line(i, ev(i)).rstrip(b"\n") for i in range(4)]
    damage(lines)
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(LedgerCorrupt, match=f"line 2 is corrupt: .*{why}"):
        FileLedger(path)
    assert path.read_bytes() == b"\n".join(lines) + b"\n"  # nothing rewritten


def test_unknown_event_type_is_corruption(tmp_path):
    path = tmp_path / "ledger.jsonl"

    class Future:
        def to_dict(self):
            return {"type": "teleport", "version": 1}

    path.write_bytes(encode_line(0, Future()) + encode_line(1, ev(1)))
    with pytest.raises(LedgerCorrupt, match="line 1 .*unknown event type 'teleport'"):
        FileLedger(path)


def test_second_writer_is_locked_out(tmp_path):
    """In one process (a notebook cell run twice) the message names this process as the holder."""
    path = tmp_path / "ledger.jsonl"
    with FileLedger(path):
        with pytest.raises(LedgerLocked, match=r"held by this process \(close the earlier PrivateLearner, or use "
                                               r"`with PrivateLearner\(\.\.\.\) as learner:`\)"):
            FileLedger(path)
    with FileLedger(path) as led:  # released on close
        assert led.events() == []


def test_a_writer_in_another_process_is_named_as_such(tmp_path):
    path = tmp_path / "ledger.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LedgerLocked, match="in use by another process") as exc:
            FileLedger(path)
        assert "this process" not in str(exc.value)
    finally:
        holder.kill()
        holder.wait()


HOLDER = r"""
import sys, time
from stream_vips.privacy.ledger import FileLedger
led = FileLedger(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


WRITER = r"""
import sys
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import FileLedger
led = FileLedger(sys.argv[1])
i = len(led.events())
out = sys.stdout
out.write(f"open {i}\n"); out.flush()
while True:
    out.write(f"try {i}\n"); out.flush()
    led.append(SubsampledGaussianEvent(1.0 + i / 1000, 0.1, "poisson"))
    out.write(f"done {i}\n"); out.flush()
    i += 1
"""


def test_sigkill_never_loses_an_acknowledged_event(tmp_path):
    """Kill a writer at random points, many times: the ledger always holds every event whose
    append returned, never more than were attempted, and is always readable."""
    path = tmp_path / "ledger.jsonl"
    rnd = random.Random(11)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    acknowledged = attempted = 0
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        first = proc.stdout.readline().split()
        assert first[0] == b"open" and int(first[1]) >= acknowledged
        time.sleep(rnd.uniform(0.0, 0.08))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for line in proc.stdout.read().splitlines():
            kind, i = line.split()
            if kind == b"done":
                acknowledged = max(acknowledged, int(i) + 1)
            elif kind == b"try":
                attempted = max(attempted, int(i) + 1)
        proc.stdout.close()
        with FileLedger(path) as led:
            n = len(led.events())
            assert acknowledged <= n <= attempted
            assert led.events() == [SubsampledGaussianEvent(1.0 + i / 1000, 0.1, "poisson") for i in range(n)]
    assert acknowledged > 12  # the writers did make progress


def test_failed_append_leaves_no_partial_line(tmp_path, monkeypatch):
    """A write that fails half way (e.g. disk full) is cut back, so the next append starts a
    clean line and the ledger stays readable."""
    import stream_vips.privacy.ledger as ledger_mod

    path = tmp_path / "ledger.jsonl"
    with FileLedger(path) as led:
        led.append(ev(0))
        real_write = os.write

        def half_then_fail(fd, data):
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(ledger_mod.os, "write", half_then_fail)
        with pytest.raises(OSError, match="No space"):
            led.append(ev(1))
        monkeypatch.setattr(ledger_mod.os, "write", real_write)
        assert led.events() == [ev(0)]
        assert led.append(ev(1)) == 1
    with FileLedger(path) as led:
        assert led.events() == [ev(0), ev(1)]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 6), cut=st.floats(0.0, 1.0))
def test_any_truncation_keeps_exactly_the_complete_lines(tmp_path, n, cut):
    """A crash can cut the file anywhere after the last fsynced byte: reopening keeps exactly
    the events whose line (with its newline) survived, and the genesis when it survived."""
    path = tmp_path / f"ledger-{n}-{cut}.jsonl"
    genesis = new_genesis()
    whole = encode_genesis(genesis) + b"".join(encode_line(i, ev(i)) for i in range(n))
    k = int(cut * len(whole))
    path.write_bytes(whole[:k])
    with FileLedger(path) as led:
        complete = whole[:k].count(b"\n")
        assert led.events() == [ev(i) for i in range(max(0, complete - 1))]
        assert (led.ledger_id == genesis["ledger_id"]) == (complete >= 1)
    if complete:
        assert path.read_bytes() == b"".join(whole.splitlines(keepends=True)[:complete])


@pytest.mark.parametrize("content", [b'{"x": [1, 2], "y": 1}', b"age,income\n"[:-1], b'{"schema": "model-message.v1"'])
def test_a_one_line_file_without_newline_that_is_not_a_ledger_is_refused_not_cut(tmp_path, content):
    """Pointing a ledger at some other file (a one-line data file, a model) must not cut that line
    as a torn write: only a genesis can be torn before any complete line."""
    path = tmp_path / "other.json"
    path.write_bytes(content)
    with pytest.raises(LedgerCorrupt, match="not a ledger"):
        FileLedger(path)
    assert path.read_bytes() == content


@pytest.mark.parametrize("cut", [3, 11, 40])
def test_a_torn_genesis_is_still_cut(tmp_path, cut):
    """A crash while the genesis itself was written leaves a prefix of it: that is a torn write."""
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(encode_genesis(new_genesis())[:cut])
    with FileLedger(path) as led:
        assert led.events() == [] and led.append(ev(0)) == 0
    with FileLedger(path) as led:
        assert led.events() == [ev(0)]


def test_event_lines_start_as_the_torn_write_rule_expects():
    """The torn-line rule recognises an event line by how encode_line starts it (with and without a position)."""
    from stream_vips.privacy.ledger import _EVENT_PREFIXES, _GENESIS_PREFIX

    assert encode_line(3, ev(3)).startswith(_EVENT_PREFIXES) and encode_line(3, ev(3), 17).startswith(_EVENT_PREFIXES)
    assert encode_genesis(new_genesis()).startswith(_GENESIS_PREFIX)


@pytest.mark.parametrize("foreign", [b"operator note", b"x", b'{"note": "kept"}', b"\x00\x00ftyp\x01"])
def test_foreign_bytes_appended_to_a_ledger_are_refused_not_cut(tmp_path, foreign):
    """``printf 'operator note' >> ledger.jsonl`` leaves an incomplete last line that is not how a
    ledger line starts: it is not a torn write, so opening refuses and changes nothing."""
    path = tmp_path / "ledger.jsonl"
    with FileLedger(path) as led:
        led.append(ev(0))
    path.write_bytes(path.read_bytes() + foreign)
    before = path.read_bytes()
    with pytest.raises(LedgerCorrupt, match="line 3 is incomplete and is not the start of a ledger line"):
        FileLedger(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize("cut", [1, 2, 6, 9, 30])
def test_a_torn_event_line_with_a_position_is_still_cut(tmp_path, cut):
    path = tmp_path / "ledger.jsonl"
    with FileLedger(path) as led:
        led.append(ev(0), 5)
    whole = path.read_bytes()
    path.write_bytes(whole + encode_line(1, ev(1), 9)[:cut])
    with FileLedger(path) as led:
        assert led.events() == [ev(0)] and path.read_bytes() == whole


@pytest.mark.parametrize("lines", [0, 1, 2])
def test_a_tail_of_nul_bytes_left_by_a_crash_is_cut_as_torn(tmp_path, caplog, lines):
    """A crash can leave the file extended but its last blocks unwritten (XFS, ext4 data=writeback):
    they read as NUL bytes, with no newline. That is a torn write, cut with a warning, whether it
    follows whole lines or is all the file holds (the genesis never reached the disk)."""
    path = tmp_path / "ledger.jsonl"
    if lines:
        with FileLedger(path) as led:
            for i in range(lines - 1):
                led.append(ev(i))
        whole = path.read_bytes()
    else:
        whole = b""
    path.write_bytes(whole + b"\x00" * 4096)
    with caplog.at_level(logging.WARNING, logger="stream_vips.privacy.ledger"):
        with FileLedger(path) as led:
            assert led.events() == [ev(i) for i in range(max(0, lines - 1))]
    assert "dropping torn last line" in caplog.text
    assert b"\x00" not in path.read_bytes() and (not whole or path.read_bytes() == whole)



def test_a_torn_first_event_of_a_ledger_written_before_geneses_is_cut_and_agrees_with_the_probe(tmp_path):
    """Older ledgers start with an event line: a crash while writing the first one leaves a prefix
    of it, which FileLedger cuts like a torn genesis, and the first-line probe calls it a ledger."""
    from stream_vips.privacy.ledger import starts_like_ledger

    path = tmp_path / "ledger.jsonl"
    torn = encode_line(0, ev(0))[:40]
    path.write_bytes(torn)
    assert starts_like_ledger(torn)
    with FileLedger(path) as led:
        assert led.events() == []
