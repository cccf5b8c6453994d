"""A record whose value is JSON ``null`` reaches the pipeline from every local source (memory,
JSONL file, stdin) and is dead-lettered as ``not_object`` without stopping the run. (A record with
no value at all, a Kafka tombstone, is tests/test_none_values.py.)"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from connectors.jsonl import JsonlSource
from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
from connectors.stdio import StdinSource
from stream_vips.config import config_from_dict
from stream_vips.service.app import Application
from test_pipeline import cfg_dict, synthetic_lines

N_GOOD = 300
NULL_AT = (0, 150, 301)  # first, in the middle, last of the stream


def stream_with_nulls() -> list[bytes]:
    values = list(synthetic_lines(N_GOOD))
    for i in NULL_AT:
        values.insert(i, b"null")
    return values


def memory_source(tmp_path: Path) -> MemorySource:
    return MemorySource(stream_with_nulls())


def jsonl_source(tmp_path: Path) -> JsonlSource:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(v + b"\n" for v in stream_with_nulls()))
    return JsonlSource(str(path))


def stdin_source(tmp_path: Path) -> StdinSource:
    return StdinSource(io.BytesIO(b"".join(v + b"\n" for v in stream_with_nulls())))


@pytest.mark.parametrize("make_source", [memory_source, jsonl_source, stdin_source], ids=["memory", "jsonl", "stdin"])
def test_a_null_value_is_dead_lettered_as_not_an_object_and_the_run_continues(tmp_path, make_source):
    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": 50.0}), env={})
    dead = MemoryDeadLetterSink()
    app = Application.from_config(cfg, source=make_source(tmp_path), dead_letter=dead, sink=MemorySink())
    stats = app.run()
    assert [(letter.reason, letter.record.value) for letter in dead.letters] == [("not_object", b"null")] * 3
    assert stats.records == N_GOOD + len(NULL_AT) and stats.accepted == N_GOOD
    assert stats.updates == 1 + (stats.records - 200) // 100  # every arrival counts towards the schedule
