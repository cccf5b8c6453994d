"""The mutation record of the privacy wall (benchmarks/results/mutation.json, written by
tools/mutation.py with mutmut) is current and explains its survivors. Needs neither mutmut nor a
mutation run: it compares source hashes and the lists in tests/mutation/, so CI stays fast; a
module whose source changed fails here, naming the command that re-runs only that module."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
mutation = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = mutation  # its dataclasses look their module up
_spec.loader.exec_module(mutation)


def test_the_record_is_current_and_every_survivor_is_a_test_gap_listed_or_an_equivalent():
    results = json.loads(mutation.RESULTS.read_text(encoding="utf-8"))
    found = mutation.problems(results, mutation.read_equivalent(), mutation.read_untriaged())
    assert not found, "\n".join(found)


def test_the_record_covers_every_target_not_pending_with_its_counts():
    results = json.loads(mutation.RESULTS.read_text(encoding="utf-8"))
    pending = {p for p in mutation.TARGETS if mutation.PENDING + p in mutation.read_untriaged()}
    assert list(results["modules"]) == [p for p in mutation.TARGETS if p not in pending]
    assert results["met"] is (not pending and not mutation.read_untriaged() and not mutation.problems(
        results, mutation.read_equivalent(), set()))
    for path, record in results["modules"].items():
        counted = sum(record[k] for k in ("killed", "survived", "timeout", "no tests", "other"))
        assert counted == record["mutants"] > 0, path
        assert record["survived"] + record["no tests"] + record["other"] == len(record["survivors"]), path
        assert record["equivalent"] + record["untriaged"] + len(record["unexplained"]) == len(record["survivors"])


def test_a_changed_module_or_target_makes_its_record_stale(monkeypatch):
    path = "stream_vips/privacy/budget.py"
    record = {"modules": {p: {"source_hash": mutation.module_hash(p), "survivors": []} for p in mutation.TARGETS}}
    assert mutation.problems(record, {}, set()) == []
    narrower = mutation.Target(mutation.TARGETS[path].tests[:1])
    monkeypatch.setitem(mutation.TARGETS, path, narrower)
    assert mutation.problems(record, {}, set()) == [
        f"{path}: mutation result stale (re-run: python tools/mutation.py --module {path})"]


def test_survivors_are_keyed_by_function_and_mutated_text_and_lists_are_checked_both_ways(tmp_path):
    diff = ("--- a\n+++ b\n@@ -1,3 +1,3 @@\n def f(x):\n-    return x < 1  # bound\n+    return x <= 1  # bound\n")
    label = mutation.function_label("stream_vips.core.data.window.x_f__mutmut_3")
    key = mutation.mutant_key("stream_vips/core/data/window.py", label, diff)
    assert key == "stream_vips/core/data/window.py | f | return x <= 1"
    label = mutation.function_label("stream_vips.core.data.window.xǁWindowReservoirǁadmit__mutmut_12")
    assert label == "WindowReservoir.admit"
    listed = tmp_path / "equivalent.txt"
    listed.write_text(f"# comment\n\n{key} | x is an integer here\n")
    assert mutation.read_equivalent(listed) == {key: "x is an integer here"}
    listed.write_text(f"{key}\n")
    with pytest.raises(ValueError, match="reason"):
        mutation.read_equivalent(listed)
    path = "stream_vips/core/data/window.py"
    record = {"modules": {p: {"source_hash": mutation.module_hash(p), "survivors": []} for p in mutation.TARGETS}}
    record["modules"][path]["survivors"] = [{"key": key, "status": "survived"}]
    assert mutation.problems(record, {}, set()) == [f"unexplained survivor: {key}"]
    assert mutation.problems(record, {key: "reason"}, set()) == []
    assert mutation.problems(record, {}, {key}) == []
    record["modules"][path]["survivors"] = []
    assert mutation.problems(record, {key: "reason"}, set()) == [f"listed but not a recorded survivor: {key}"]
    pending = {mutation.PENDING + path}
    assert mutation.problems(record, {}, pending) == [f"listed as pending but recorded: {mutation.PENDING}{path}"]
    del record["modules"][path]
    assert mutation.problems(record, {}, pending) == []


def test_writing_drops_the_stale_record_of_a_pending_module_and_keeps_a_current_one(tmp_path):
    stale, current = "stream_vips/privacy/budget.py", "stream_vips/core/data/window.py"
    empty = {"survivors": [], "mutants": 1, "killed": 1}
    results = {"modules": {stale: {**empty, "source_hash": "0" * 64},
                           current: {**empty, "source_hash": mutation.module_hash(current)}}}
    pending = {mutation.PENDING + stale, mutation.PENDING + current}
    mutation.write(results, {}, pending, tmp_path / "mutation.json")
    written = json.loads((tmp_path / "mutation.json").read_text(encoding="utf-8"))
    assert list(written["modules"]) == [current]  # a fresh pass is kept: the check asks to drop its pending line
    assert f"listed as pending but recorded: {mutation.PENDING}{current}" in mutation.problems(written, {}, pending)
