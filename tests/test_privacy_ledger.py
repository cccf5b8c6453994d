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


# --- Pinned by the mutation pass of ledger.py (tools/mutation.py) ------------------------------

#: Lines as this release writes them: a ledger written by an earlier run must still read, and
#: this release must write byte for byte the same lines (the checksum covers the canonical form).
GOLDEN_GENESIS = (b'{"genesis":{"created_at":"2024-01-01T00:00:00+00:00",'
                  b'"ledger_id":"00000000000000000000000000000000","supersedes":[]},"sha256":"4200a103ec4e9146a81196124601c02498ad6da1865a09b41b43f31189020dec"}\n')
GOLDEN_EVENT = (b'{"at":5,"event":{"adjacency":"replace_one","count":1,"diameter":2.0,"noise_multiplier":1.0,'
                b'"sampling":"poisson","sampling_rate":0.1,"type":"subsampled_gaussian","version":1},'
                b'"sha256":"e48b1e4875a733e63d98b963f16880d6e691d157416658c0e183420108abfe10","step":0,"window":3}\n')


def test_lines_are_written_and_read_in_the_recorded_format(tmp_path):
    genesis = {"ledger_id": "0" * 32, "created_at": "2024-01-01T00:00:00+00:00", "supersedes": []}
    assert encode_genesis(genesis) == GOLDEN_GENESIS
    assert encode_line(0, ev(0), 5, 3) == GOLDEN_EVENT
    path = tmp_path / "old.jsonl"
    path.write_bytes(GOLDEN_GENESIS + GOLDEN_EVENT)
    with FileLedger(path) as led:
        assert led.ledger_id == "0" * 32 and led.events() == [ev(0)]
        assert led.last_position == 5 and led.windows() == [3]


def test_a_line_in_another_json_form_is_checked_canonically(tmp_path, monkeypatch):
    """Lines not in the canonical form (spaces, another key order) are checked by re-serializing
    their body; canonical lines are checked by the fast path, without a second parse."""
    import json

    import stream_vips.privacy.ledger as ledger_mod

    spaced = json.dumps({"step": 0, "event": ev(0).to_dict(), "at": 5, "window": 3,
                         "sha256": "e48b1e4875a733e63d98b963f16880d6e691d157416658c0e183420108abfe10"}).encode()
    path = tmp_path / "spaced.jsonl"
    path.write_bytes(GOLDEN_GENESIS + spaced + b"\n")
    with FileLedger(path) as led:
        assert led.events() == [ev(0)] and led.windows() == [3]
    path.write_bytes(GOLDEN_GENESIS + spaced.replace(b'"at": 5', b'"at": 6') + b"\n")
    with pytest.raises(LedgerCorrupt, match="line 2 is corrupt: checksum mismatch"):
        FileLedger(path)

    class NoSlowPath:
        dumps = staticmethod(json.dumps)

        @staticmethod
        def loads(*args, **kwargs):
            raise AssertionError("a canonical line took the slow path")

    monkeypatch.setattr(ledger_mod, "json", NoSlowPath)
    path.write_bytes(GOLDEN_GENESIS + GOLDEN_EVENT + encode_line(1, ev(1), 7, 3))
    with FileLedger(path) as led:
        assert led.events() == [ev(0), ev(1)]


def test_a_line_that_is_not_json_is_refused_even_with_a_matching_checksum(tmp_path):
    body = GOLDEN_EVENT.replace(b',"sha256":"e48b1e4875a733e63d98b963f16880d6e691d157416658c0e183420108abfe10"', b"")
    import hashlib

    forged = b',"sha256":"' + hashlib.sha256(body.rstrip(b"\n")).hexdigest().encode() + b'"' + body
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(GOLDEN_GENESIS + forged)
    with pytest.raises(LedgerCorrupt, match="line 2 is corrupt: not JSON"):
        FileLedger(path)


def test_new_genesis_records_its_creation_time_in_utc():
    from datetime import datetime, timedelta

    genesis = new_genesis(["b", "a", "b"])
    assert set(genesis) == {"ledger_id", "created_at", "supersedes"} and genesis["supersedes"] == ["a", "b"]
    assert datetime.fromisoformat(genesis["created_at"]).utcoffset() == timedelta(0)


def test_a_ledger_written_before_geneses_has_a_legacy_id_that_binds(tmp_path):
    import hashlib

    path = tmp_path / "old.jsonl"
    first = encode_line(0, ev(0), 4)
    path.write_bytes(first + encode_line(1, ev(1), 8))
    with FileLedger(path) as led:
        assert led.ledger_id == "legacy-" + hashlib.sha256(first.rstrip(b"\n")).hexdigest()[:24]
        assert led.supersedes == () and led.events() == [ev(0), ev(1)]
        check_binding(led, "checkpoint", None, 2)  # state written before ledger ids: the step still binds
        with pytest.raises(LedgerMismatch, match="holds only 2: the ledger was rolled back"):
            check_binding(led, "checkpoint", None, 3)
        assert led.append(ev(2)) == 2
    with FileLedger(path) as led:
        assert led.events() == [ev(0), ev(1), ev(2)] and led.ledger_id.startswith("legacy-")


def test_windows_and_positions_survive_a_restart(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with FileLedger(path) as led:
        assert led.append_many([(ev(0), 0), (ev(1), 10), (ev(2), None)], window=1) == 0
        assert led.append_many([(ev(3), 20)]) == 3
        assert led.windows() == [1, 1, 1, None]
    lines = path.read_bytes().splitlines()
    assert len(lines) == 5 and all(line.startswith(b'{"') for line in lines)
    with FileLedger(path) as led:
        assert led.events() == [ev(i) for i in range(4)]
        assert led.windows() == [1, 1, 1, None] and led.last_position == 20


@pytest.mark.parametrize("field, value", [("at", True), ("at", 1.5), ("at", "5"), ("at", -1),
                                          ("window", True), ("window", 2.5), ("window", "3"), ("window", 0),
                                          ("extra", 1)])
def test_a_bad_position_or_window_is_corruption(tmp_path, field, value):
    import stream_vips.privacy.ledger as ledger_mod

    line = ledger_mod._line({"step": 0, "event": ev(0).to_dict(), field: value})
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(GOLDEN_GENESIS + line)
    with pytest.raises(LedgerCorrupt, match="line 2 is corrupt"):
        FileLedger(path)


@pytest.mark.parametrize("genesis, why", [({"created_at": "x"}, "genesis without a ledger_id"),
                                          (5, "genesis without a ledger_id"),
                                          ({"ledger_id": 7}, "genesis without a ledger_id")])
def test_a_genesis_without_an_id_is_corruption(tmp_path, genesis, why):
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(encode_genesis(genesis))
    with pytest.raises(LedgerCorrupt, match=f"line 1 is corrupt: {why}"):
        FileLedger(path)


def test_an_event_field_of_the_wrong_kind_is_corruption(tmp_path):
    import stream_vips.privacy.ledger as ledger_mod

    data = ev(0).to_dict()
    data["noise_multiplier"] = [1.0]  # unhashable: not cached, still checked
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(GOLDEN_GENESIS + ledger_mod._line({"step": 0, "event": data}))
    with pytest.raises(LedgerCorrupt, match="line 2 is corrupt: noise_multiplier must be"):
        FileLedger(path)


def test_replayed_identical_events_share_one_object(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with FileLedger(path) as led:
        led.append_many([(ev(0), None)] * 3)
    with FileLedger(path) as led:
        a, b, c = led.events()
        assert a == ev(0) and a is b is c


@pytest.mark.parametrize("tail", [b'{"genesis":{', b"XX", b"X"])
def test_a_partial_genesis_or_foreign_bytes_after_the_genesis_are_refused(tmp_path, tail):
    """Only the first line can be a torn genesis; line 2 is checked like any later line."""
    path = tmp_path / "ledger.jsonl"
    FileLedger(path).close()
    path.write_bytes(path.read_bytes() + tail)
    before = path.read_bytes()
    with pytest.raises(LedgerCorrupt, match=f"ledger {path} line 2 is incomplete and is not the start"):
        FileLedger(path)
    assert path.read_bytes() == before


def test_a_corrupt_line_names_the_ledger_file(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(GOLDEN_GENESIS + b"{not json\n")
    with pytest.raises(LedgerCorrupt, match=f"^ledger {path} line 2 is corrupt"):
        FileLedger(path)


def test_file_mode_and_directory_fsync_on_creation(tmp_path, monkeypatch):
    import stream_vips.privacy.ledger as ledger_mod

    synced = []
    real = ledger_mod.fsync_dir
    monkeypatch.setattr(ledger_mod, "fsync_dir", lambda d: (synced.append(Path(d)), real(d)))
    path = tmp_path / "ledger.jsonl"
    old = os.umask(0o022)
    try:
        FileLedger(path).close()
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert synced == [tmp_path]  # the new file's directory entry is made durable
    FileLedger(path).close()
    assert synced == [tmp_path]  # an existing file: nothing to make durable


def test_close_is_idempotent_and_a_closed_ledger_refuses_appends(tmp_path):
    led = FileLedger(tmp_path / "ledger.jsonl")
    led.close()
    led.close()
    with pytest.raises(RuntimeError, match="is closed"):
        led.append(ev(0))
    with FileLedger(tmp_path / "ledger.jsonl") as again:
        assert again.events() == []


def test_a_ledger_on_file_descriptor_zero_works_and_is_released(tmp_path):
    """A daemon started with stdin closed gets descriptor 0 for its ledger."""
    path = tmp_path / "ledger.jsonl"
    saved = os.dup(0)
    os.close(0)
    try:
        led = FileLedger(path)
        try:
            assert led._fd == 0
            assert led.append(ev(0)) == 0
        finally:
            led.close()
        with FileLedger(path) as again:  # the lock was released
            assert again.events() == [ev(0)]
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_a_closed_ledger_is_no_longer_named_as_held_by_this_process(tmp_path):
    path = tmp_path / "ledger.jsonl"
    FileLedger(path).close()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(LedgerLocked, match="in use by another process"):
            FileLedger(path)
    finally:
        holder.kill()
        holder.wait()


def test_the_first_line_probes_agree_with_the_ledger(tmp_path):
    from stream_vips.privacy.ledger import first_line_is_ledger, starts_like_ledger

    cases = {
        "empty": (b"", None, False),
        "genesis": (GOLDEN_GENESIS + GOLDEN_EVENT, True, True),
        "legacy": (encode_line(0, ev(0)), True, True),
        "torn genesis": (GOLDEN_GENESIS[:5], True, True),
        "nul": (b"\0" * 8, True, True),
        "bad checksum": (GOLDEN_GENESIS.replace(b"2024", b"2025"), False, True),
        "trailing bytes": (GOLDEN_GENESIS[:-1] + b"X\n", False, True),
        # JSON allows trailing spaces and CR but not a form feed: the probe answers as opening does
        "trailing space": (GOLDEN_GENESIS[:-1] + b" \r\n", True, True),
        "trailing form feed": (GOLDEN_GENESIS[:-1] + b"\x0c\n", False, True),
        "data": (b"age,income", False, False),
        "model": (b'{"schema": "model-message.v1"}\n', False, False),
    }
    for name, (content, is_ledger, starts) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        assert first_line_is_ledger(path) is is_ledger, name
        if is_ledger is not None and content.endswith(b"\n"):
            opened = True
            try:
                FileLedger(path).close()
            except LedgerCorrupt:
                opened = False
            assert opened is is_ledger, name
        from stream_vips.privacy.ledger import read_first_line

        first = read_first_line(path)
        assert first == content.split(b"\n")[0] + (b"\n" if b"\n" in content else b""), name
        assert starts_like_ledger(first) is starts, name
