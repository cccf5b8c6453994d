"""The linreg privacy audit end to end through Kafka, with a restore and a rebalance (issue 19).

Each side of the neighbouring pair is one Kafka topic and one pipeline that lives twice:

1. Life 1 reads ``RESTORED`` filler records (x = 0, y = 0: zero in every block) to the end of
   the topic and stops gracefully, which writes the reservoir checkpoint at that offset.
2. The audited record is produced (side A: the family's worst-case record, side B: its
   neighbour, y negated). Life 2 restores the checkpoint (the source seeks to its offset) and
   reads the record into slot ``RESTORED``.
3. A second group member joins (its client id sorts first, so the range assignor hands it the
   partition), finds nothing to read, and leaves: two rebalances, the partition goes away from
   life 2 and comes back.
4. The remaining fillers are produced; the reservoir (``M`` slots) is full at the last one, and
   from then on every loop iteration is a time-triggered step releasing the whole reservoir
   (q = 1) with fresh noise: thousands of independent trials of one release
   (:mod:`stream_vips.audit.end_to_end` says why steps from one reservoir, not episodes).

The releases go through everything that can count a record twice: the Kafka source (seek on
restore, rebalance, floor), the pipeline's duplicate guard, decoding, validation and Algorithm R.
The audit is the engine audit's (``audit_samples``: projection and threshold on training
releases, Clopper-Pearson bound on test releases) at its delta 1e-3 and z = 3, against the
accountant's claim for the event the engine ledgers.

The control re-introduces the bug fixed in the privacy-integrity work: a source that re-applies
the checkpoint's seek at every assignment and keeps no floor, with the pipeline's own
``_take_new`` guard patched out on the instance (it would drop the re-read offsets otherwise).
After the partition comes back, the audited record is read again and takes a second slot, so a
replace-one change moves the batch sum by twice what the accountant was told: the audit must
prove the claim false.

A third test keeps the pipeline's guard with the rewinding source: the guard alone must keep
the record in one slot (defence in depth; a few releases, no audit).

Sizes, as in the engine audit (power from ``ideal_lower_bound``; with linreg's default weights
a_xx = a_xy the pair's sensitivity is 0.75 x 2/3 = 0.5 noise units at z = 3, the true diameter
1.5 against the engine's claimed 2, claim 1.91 at delta 1e-3): with 3,000 training and 12,000
test releases per side a perfect test reaches 0.91 on the correct pipeline and 2.20 with the
record counted twice (sensitivity x2), so the bug is caught, with a margin of about 0.3 over the
claim that the estimated threshold must not eat (an engine audit at the same doubled
sensitivity, noise halved, seed 19, reached 2.23); the correct run must also reach half the
ideal bound, or the audit would pass by seeing nothing. Each side is 15,000 steps; the file takes about 40 s on 2 cores,
most of it steps (each is one empty Kafka poll and one engine step), plus about 2 s of
rebalances per side.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from connectors.kafka import KafkaSource
from kafka_broker import create_topic, produce, unique_topic
from stream_vips.audit.end_to_end import ReleaseCapture, copies_in_reservoir, filler_record, linreg_audit_config
from stream_vips.audit.families import AUDIT_DELTA, FAMILY_AUDITS, pair_sensitivity
from stream_vips.audit.release import claimed_epsilon
from stream_vips.audit.stats import AuditResult, audit_samples, ideal_lower_bound
from stream_vips.privacy.ledger import MemoryLedger
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict

pytestmark = pytest.mark.kafka

SPEC = FAMILY_AUDITS["linreg"]
PAIR = pair_sensitivity(SPEC)
CAPACITY = 64  # M: the reservoir, the batch (q = 1) and the model's dataset size
RESTORED = 8  # fillers read by life 1, before the checkpoint
Z = SPEC.noise_multiplier  # 3, as in the engine audit
MODEL = SPEC.make_model(CAPACITY)  # the engine audit's linreg: x_bound R = 1/4, y_bound B = 2
N_TRAIN, N_TEST = 3_000, 12_000
SEEDS = (1901, 1902)  # side A, side B: independent noise
WAIT_S = 60.0


class RewindingKafkaSource(KafkaSource):
    """The source before the privacy-integrity fix: the checkpoint's seek is re-applied at every
    assignment (not once) and records below what it already returned are not dropped, so a
    rebalance after a restore re-reads everything since the checkpoint."""

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        from kafka.structs import TopicPartition

        super().seek(offsets)
        self._seek = _Sticky({TopicPartition(t, p): int(o) for (t, p), o in offsets.items()})

    def _above_floor(self, tp: Any, recs: list, floor: int) -> list:
        return recs


class _Sticky(dict):
    """A seek map whose entries survive ``pop``: the listener applies them at every assignment."""

    def pop(self, key: Any, *default: Any) -> Any:
        return self[key] if key in self else dict.pop(self, key, *default)


@dataclass
class Side:
    """One side's releases and what its reservoir held when they were made."""

    releases: np.ndarray
    claim: float
    seen: int  # arrival positions consumed by life 2's reservoir
    copies: int  # slots holding the audited record
    dropped_by_source: int
    dropped_by_pipeline: int


def _values(n: int) -> list[bytes]:
    return [json.dumps(filler_record(MODEL.dim)).encode()] * n


def _app(bs: str, topic: str, group: str, seed: int, ledger: MemoryLedger, checkpoint: Path, *,
         until_end: bool, rewinding: bool, guard: bool) -> Application:
    """One life of a side's pipeline: the configured source (``KafkaSource``, built here with the
    configured options so that its metadata can be warmed), or the :class:`RewindingKafkaSource`;
    ``guard=False`` bypasses the pipeline's duplicate guard (``_take_new``) on this instance."""
    options = {"bootstrap_servers": bs, "topics": topic, "group_id": group, "until_end": until_end,
               "session_timeout_ms": 6000, "heartbeat_interval_ms": 500, "commit_interval_s": 0.0}
    cfg = linreg_audit_config(source={"type": "kafka", **options}, capacity=CAPACITY, noise_multiplier=Z,
                              seed=seed, x_bound=MODEL.x_bound, y_bound=MODEL.y_bound, dim=MODEL.dim,
                              checkpoint_path=str(checkpoint))
    source = _warm((RewindingKafkaSource if rewinding else KafkaSource)(**options), topic)
    # one budget across both lives (the checkpoint is bound to it)
    app = Application.from_config(config_from_dict(cfg, env={}), ledger=ledger, source=source)
    if not guard:
        app._take_new = lambda raws: raws  # type: ignore[method-assign]
    return app


def _warm(source: KafkaSource, topic: str) -> KafkaSource:
    """Fetch the topic's metadata before the first poll joins the group. A group leader that
    joins without it assigns nothing, and the rejoin that follows the metadata update can stall
    in kafka-python until the rebalance timeout (minutes): a client race, not what is audited."""
    assert source._consumer.partitions_for_topic(topic) == {0}
    return source


def _wait(cond, what: str, errors: list[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if errors:
            raise AssertionError("life 2 failed:\n" + "\n".join(errors))
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_side(bs: str, record: Mapping[str, Any], seed: int, tmp: Path, *, n: int, rewinding: bool = False,
             guard: bool = True) -> Side:
    """Both lives of one side (see the module docstring); ``n`` releases after the last arrival."""
    topic, group = unique_topic("audit-in"), unique_topic("audit-g")
    create_topic(bs, topic, partitions=1)
    ledger, checkpoint = MemoryLedger(), tmp / f"{topic}.npz"

    produce(bs, topic, _values(RESTORED))
    first = _app(bs, topic, group, seed, ledger, checkpoint, until_end=True, rewinding=rewinding, guard=guard)
    deadline = time.monotonic() + WAIT_S
    first.progress = lambda app: app.stop() if time.monotonic() > deadline else None
    first.run()
    assert first.reservoir.seen == RESTORED, "life 1 did not reach the end of the topic in time"
    assert first.stats.updates == 0

    produce(bs, topic, [json.dumps(record).encode()])
    second = _app(bs, topic, group, seed, ledger, checkpoint, until_end=False, rewinding=rewinding, guard=guard)
    assert second.reservoir.seen == RESTORED  # restored from life 1's checkpoint
    capture = ReleaseCapture(second, n)
    errors: list[str] = []

    def life() -> None:
        try:
            second.run()
        except BaseException:
            errors.append(traceback.format_exc())

    thread = threading.Thread(target=life, name=f"life2-{topic}")
    thread.start()
    try:
        _wait(lambda: second.reservoir.seen >= RESTORED + 1, "the audited record", errors)
        member = _warm(KafkaSource(bs, topic, group_id=group, client_id="a-audit-member", session_timeout_ms=6000,
                                   heartbeat_interval_ms=500, commit_interval_s=3600.0), topic)
        try:
            took: list[Any] = []

            def holds() -> bool:
                took.extend(member.poll(100, 0.1))
                return bool(member._consumer.assignment())

            _wait(holds, "the second member to take the partition", errors)
            assert not took  # life 2 committed the record at the revocation: nothing left for it
        finally:
            member.close()  # leaves the group: the partition goes back to life 2
        consumer = second.source._consumer
        _wait(lambda: bool(consumer.assignment()), "life 2 to get the partition back", errors)
        produce(bs, topic, _values(CAPACITY - RESTORED - 1))
        thread.join(WAIT_S + 60)
        assert not thread.is_alive(), "life 2 did not finish its releases"
    finally:
        second.stop()
        thread.join(30)
    assert not errors, "\n".join(errors)
    return Side(capture.releases(), claimed_epsilon(second.engine.event(), AUDIT_DELTA), second.reservoir.seen,
                copies_in_reservoir(second, record), second.source.duplicates_dropped, second.stats.duplicates)


def audit(bs: str, tmp: Path, *, broken: bool) -> tuple[AuditResult, Side, Side]:
    """Both sides, the releases split into training and test, and the audit's result."""
    n = N_TRAIN + N_TEST
    a = run_side(bs, PAIR.record_a, SEEDS[0], tmp, n=n, rewinding=broken, guard=not broken)
    b = run_side(bs, PAIR.record_b, SEEDS[1], tmp, n=n, rewinding=broken, guard=not broken)
    assert len(a.releases) == len(b.releases) == n and a.claim == b.claim
    result = audit_samples(a.releases[:N_TRAIN], b.releases[:N_TRAIN], a.releases[N_TRAIN:], b.releases[N_TRAIN:],
                           AUDIT_DELTA, a.claim)
    return result, a, b


def test_kafka_pipeline_audit_after_restore_and_rebalance_stays_below_the_claim(kafka_bootstrap, tmp_path):
    """The real KafkaSource and pipeline: one slot per record, and no violation is found."""
    result, a, b = audit(kafka_bootstrap, tmp_path, broken=False)
    for side in (a, b):  # each record took one position and one slot
        assert (side.seen, side.copies) == (CAPACITY, 1), side
    assert result.epsilon_lower_bound <= result.claimed_epsilon, result.to_dict()
    # not vacuous: the test sees the pair at least half as well as a perfect test would
    ideal = ideal_lower_bound(PAIR.sensitivity, N_TEST, AUDIT_DELTA)
    assert result.epsilon_lower_bound >= 0.5 * ideal, (ideal, result.to_dict())


def test_a_source_that_rereads_after_the_rebalance_fails_the_audit(kafka_bootstrap, tmp_path):
    """The old bug (rewinding source, pipeline guard bypassed): the audit proves the claim false."""
    result, a, b = audit(kafka_bootstrap, tmp_path, broken=True)
    for side in (a, b):  # the bug happened: the record was read again after the rebalance, nothing dropped it
        assert side.seen > CAPACITY and side.copies >= 2, side
        assert side.dropped_by_source == side.dropped_by_pipeline == 0, side
    assert result.violated, result.to_dict()


def test_the_pipeline_guard_alone_stops_the_rewinding_source(kafka_bootstrap, tmp_path):
    """The control's source with the pipeline's ``_take_new`` in place: the re-read record is
    dropped there (counted), so the reservoir holds it once, as with the real source. A handful
    of releases suffices: this checks the reservoir the audit would sample, not the noise."""
    side = run_side(kafka_bootstrap, PAIR.record_a, SEEDS[0], tmp_path, n=10, rewinding=True)
    assert (side.seen, side.copies, side.dropped_by_source) == (CAPACITY, 1, 0), side
    assert side.dropped_by_pipeline >= 1, side
