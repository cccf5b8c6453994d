"""A sharded driver killed mid-step (SIGKILL, no shutdown) and started again on its ledger, its
shard checkpoints and its model sink: epsilon never decreases, no version is published twice,
each shard comes back from its checkpoint and reads each later record once, and the driver
goes on from the model it last published (privacy rule 14; rules 7 and 11 for the ledger).

Each life is a child process running this module (local shards; a kill on Ray would test Ray's
restart, not the driver's). Two kill points: during the gather (the shards were asked for their
sums: nothing paid) and after the ledger entry, before the model went out (paid, never
published: that version stays unpublished and the spent epsilon still counts it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
PER_SHARD = 200
KILL_AT = 4  # the step of the first life during which it is killed


class LineSource:
    """A seekable source of one partition: the lines of ``path`` at offsets 0, 1, ..."""

    def __init__(self, path: str, partition: int) -> None:
        self.values = Path(path).read_bytes().splitlines()
        self.partition, self.next = partition, 0

    def poll(self, max_records: int, timeout_s: float) -> list[Any]:
        from stream_vips.io import RawRecord

        start, self.next = self.next, min(len(self.values), self.next + max_records)
        return [RawRecord(self.values[o], {"topic": "t", "partition": self.partition, "offset": o})
                for o in range(start, self.next)]

    def positions(self) -> dict[tuple[str, int], int]:
        return {("t", self.partition): self.next}

    def seek(self, offsets: Any) -> None:
        self.next = offsets[("t", self.partition)]

    def commit(self, positions: Any = None) -> None: ...

    commit_now = commit

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    @property
    def exhausted(self) -> bool:
        return self.next >= len(self.values)

    def close(self) -> None: ...


def config(tmp: Path) -> Any:
    from stream_vips.service.build import config_from_dict

    return config_from_dict({
        "model": {"family": "linreg", "params": {"dim": 2}},
        "sink": {"type": "jsonl", "path": str(tmp / "models.jsonl")},
        "sampling": {"reservoir": 60, "batch_size": 12},
        "schedule": {"every_records": 30},
        "privacy": {"epsilon": 10.0, "planned_steps": 20,
                    "ledger": {"type": "file", "path": str(tmp / "ledger.jsonl")}},
        "runtime": {"shards": 2, "checkpoint_path": str(tmp / "slices.npz"), "checkpoint_interval_s": 0,
                    "poll_max_records": 10, "publish_interval_s": 0},
    }, env={})


def life(tmp: Path, kill: str) -> None:
    """One life of the driver (in a child process): ``kill`` is ``gather``, ``paid`` or ``none``."""
    from stream_vips.distributed import LocalPool, ShardedLearner
    from stream_vips.service import build

    cfg = config(tmp)
    pool = LocalPool(cfg, 2, sources=lambda i: (lambda: LineSource(str(tmp / f"records.shard{i}.jsonl"), i)))
    sink = build.connector("sink", cfg)
    learner = ShardedLearner(cfg, pool)
    resumed = learner.resume(sink)
    resumed_state = {k: v.tolist() for k, v in learner.model.state().items()}
    calls = {"contribution": 0, "update": 0}

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if kill == "gather":
        call = pool.call

        def killing_call(method: str, args: Any, timeout_s: float | None = None) -> Any:
            if method == "contribution":
                calls["contribution"] += 1
                if calls["contribution"] == KILL_AT:
                    die()
            return call(method, args, timeout_s)
        pool.call = killing_call  # type: ignore[method-assign]
    elif kill == "paid":
        update = learner.model.update

        def killing_update(noisy_mean: Any, rho: float) -> None:
            calls["update"] += 1
            if calls["update"] == KILL_AT:  # the ledger holds this step; its model is never made
                die()
            update(noisy_mean, rho)
        learner.model.update = killing_update  # type: ignore[method-assign]
    learner.serve(sink)
    report = {"resumed": resumed, "resumed_state": resumed_state, "restored": [s.restored for s in pool.members],
              "seen": [s.status().seen for s in pool.members], "steps": learner.steps_taken,
              "epsilon": learner.epsilon_spent}
    learner.close()
    pool.close()
    sink.close()
    print(json.dumps(report))


def run_life(tmp: Path, kill: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, __file__, str(tmp), kill], capture_output=True, text=True, env=env,
                          timeout=120)


def ledger_steps(tmp: Path) -> int:
    from stream_vips.privacy.ledger import FileLedger

    ledger = FileLedger(str(tmp / "ledger.jsonl"))
    try:
        return len(ledger.events())
    finally:
        ledger.close()


def models(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "models.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("kill", ["gather", "paid"])
def test_a_driver_killed_mid_step_restarts_on_its_ledger_and_checkpoints(tmp_path: Path, kill: str) -> None:
    from stream_vips.messages import decode_state
    from test_distributed import records

    for i in range(2):
        lines = [json.dumps(r) for r in records(PER_SHARD, seed=40 + i)]
        (tmp_path / f"records.shard{i}.jsonl").write_text("\n".join(lines) + "\n")
    first = run_life(tmp_path, kill)
    assert first.returncode == -signal.SIGKILL, first.stderr
    paid = ledger_steps(tmp_path)
    before = models(tmp_path)
    versions = [m["version"] for m in before]
    if kill == "gather":  # asked for the sums of step KILL_AT - 1: nothing paid for it
        assert paid == KILL_AT - 1 and versions == list(range(paid))
    else:  # step KILL_AT - 1 paid, its model never made
        assert paid == KILL_AT and versions == list(range(paid - 1))
    eps_before = before[-1]["privacy"]["epsilon_spent"]

    second = run_life(tmp_path, "none")
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout.splitlines()[-1])
    assert report["restored"] == [True, True]  # both shards from their checkpoints
    assert report["seen"] == [PER_SHARD, PER_SHARD]  # every record read once, none twice
    assert report["resumed"] == versions[-1]  # the driver took up the model it had published
    published = decode_state(before[-1])
    assert all(np.allclose(np.asarray(report["resumed_state"][k]), v) for k, v in published.items())
    after = models(tmp_path)
    all_versions = [m["version"] for m in after]
    assert all_versions[:len(versions)] == versions and len(after) > len(before)
    assert len(set(all_versions)) == len(all_versions), "a version published twice"
    assert all_versions == sorted(all_versions)
    if kill == "paid":
        assert paid - 1 not in all_versions  # paid, never published; the next step is the next ledger step
        assert all_versions[len(versions)] == paid
    epsilons = [m["privacy"]["epsilon_spent"] for m in after]
    assert all(b > a for a, b in zip(epsilons, epsilons[1:])), "epsilon decreased"
    assert epsilons[len(versions)] > eps_before
    total = ledger_steps(tmp_path)
    assert total == all_versions[-1] + 1 and after[-1]["privacy"]["steps"] == total
    assert report["epsilon"] == pytest.approx(epsilons[-1])
    # a third life with nothing left to read takes no step and publishes nothing again
    third = run_life(tmp_path, "none")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout.splitlines()[-1])["steps"] == 0
    assert models(tmp_path) == after and ledger_steps(tmp_path) == total


if __name__ == "__main__":
    life(Path(sys.argv[1]), sys.argv[2])
