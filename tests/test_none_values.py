"""A record with no value at all (a Kafka tombstone: value None) is dead-lettered as ``tombstone``
and the run goes on, on both validation paths (decode every arrival, or only the admitted ones),
with the letter written to the JSONL dead-letter file. A JSON ``null`` value, which the local
sources deliver as bytes, is tests/test_null_records.py."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from connectors.memory import MemorySink
from stream_vips.config import config_from_dict
from stream_vips.io import RawRecord
from stream_vips.service.app import Application
from test_pipeline import cfg_dict, synthetic_lines

N_GOOD = 300
TOMBSTONES_AT = (0, 150, 199)  # within the first 200 arrivals, which fill the reservoir: admitted either way


class ListSource:
    """Delivers given records as a broker would, a value of None included (a tombstone)."""

    def __init__(self, records: Sequence[RawRecord]) -> None:
        self._records = list(records)
        self.paused = False

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        if self.paused:
            return []
        out, self._records = self._records[:max_records], self._records[max_records:]
        return out

    def commit(self) -> None:
        """Nothing to commit: the records are in memory."""

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    @property
    def exhausted(self) -> bool:
        return not self._records

    def close(self) -> None:
        """Nothing to release."""


def records() -> list[RawRecord]:
    values: list[bytes | None] = list(synthetic_lines(N_GOOD))
    for i in TOMBSTONES_AT:
        values.insert(i, None)
    return [RawRecord(value, {"offset": i, "key": b"user-7"}) for i, value in enumerate(values)]


@pytest.mark.parametrize("validation", ["all", "admitted"])
def test_a_record_without_a_value_is_dead_lettered_as_tombstone_and_the_run_continues(tmp_path, validation):
    cfg = config_from_dict(cfg_dict(tmp_path, privacy={"epsilon": 50.0}, sampling={"validation": validation}),
                           env={})
    app = Application.from_config(cfg, source=ListSource(records()), sink=MemorySink())
    stats = app.run()
    letters = [json.loads(line) for line in (tmp_path / "dead.jsonl").read_text().splitlines()]
    tombstones = [letter for letter in letters if letter["reason"] == "tombstone"]
    assert sorted(letter["origin"]["offset"] for letter in tombstones) == list(TOMBSTONES_AT)
    assert stats.records == N_GOOD + len(TOMBSTONES_AT) and stats.rejected["tombstone"] == len(TOMBSTONES_AT)
    assert stats.updates == 1 + (stats.records - 200) // 100  # every arrival counts towards the schedule
