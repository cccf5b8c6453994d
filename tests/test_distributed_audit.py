"""The empirical privacy audit (tests/test_audit.py, docs/audit.md) through the sharded path.

Each side of linreg's audited neighbouring pair is released many times by
:meth:`ShardedLearner.step` over two local shards (privacy rule 14): shard 0's slice holds the
audited record in one slot and a rejected arrival (an empty slot) in the other, shard 1's slice
two rejected arrivals, so the sides differ in exactly one slot of one slice. Every release goes
through the driver's plan, the shards' clipping and the driver's one noise draw; the model's
update is replaced by a hook that records the noisy mean, so every release is from the same
public state (the audit of one release, repeated). The bound from the threshold test must stay
below the epsilon the accountant claims for the ledgered event, which must be the event the
one-process audit is about, and must come within half of what a perfect test reaches; a sharded
path that counts a slice twice (a record in two shards' sums) must be caught.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from stream_vips.audit.families import AUDIT_DELTA, FAMILY_AUDITS, pair_sensitivity
from stream_vips.audit.release import AUDIT_BUDGET, claimed_epsilon, flatten
from stream_vips.audit.spec import trials
from stream_vips.audit.stats import audit_samples, ideal_lower_bound
from stream_vips.distributed import LocalPool, Shard, ShardContribution, ShardedLearner
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.ledger import MemoryLedger
from stream_vips.service.build import config_from_dict

N_TRAIN, N_TEST, SEED = 2_000, 8_000, 34
SPEC = FAMILY_AUDITS["linreg"]
NULL = b'{"not": "a linreg record"'  # rejected: an empty slot, contributing zero


class ShardedTrials:
    """Releases of one side through a 2-shard driver (see the module docstring)."""

    def __init__(self, record: dict[str, Any], seed: int, shard_class: type[Shard] = Shard) -> None:
        model = SPEC.make_model(SPEC.capacity)
        cfg = config_from_dict({
            "model": {"family": "linreg", "params": {"dim": model.dim, "x_bound": model.x_bound,
                                                     "y_bound": model.y_bound}},
            "sampling": {"reservoir": SPEC.capacity, "batch_size": SPEC.batch_size, "method": SPEC.sampling,
                         "max_rejected_fraction": 1.0},
            "privacy": {"noise_multiplier": SPEC.noise_multiplier, "seed": seed, "delta": AUDIT_DELTA,
                        "ledger": {"type": "memory"}},
            "runtime": {"shards": 2},
        }, env={})
        self.learner = ShardedLearner(cfg, LocalPool(cfg, 2, shard_class=shard_class))
        # the monitor gates every trial and never shapes one (as in the one-process audit)
        engine = self.learner.engine
        engine.monitor = self.learner.monitor = BudgetMonitor(
            AUDIT_BUDGET, AUDIT_DELTA, make_accountant("strong", engine.sampler.name), MemoryLedger())
        half = SPEC.capacity // 2
        self.learner.observe(self.learner.pool.call("feed", [([json.dumps(record).encode()] + [NULL] * (half - 1),
                                                               None), ([NULL] * half, None)]))
        assert self.learner.slices.full
        self.blocks = tuple(self.learner.model.blocks())
        self._captured: list[np.ndarray] = []
        self.learner.model.update = lambda noisy_mean, rho: self._captured.append(  # type: ignore[method-assign]
            flatten(noisy_mean, self.blocks))

    @property
    def event(self) -> Any:
        return self.learner.engine.event()

    def __call__(self, n: int) -> np.ndarray:
        self._captured.clear()
        for _ in range(n):
            assert self.learner.step() is not None
        return np.array(self._captured)


class DoubleCounting(Shard):
    """A broken layout: shard 0's sums reach the driver twice (as if its record were in two slices)."""

    def contribution(self, model_state: Any, plan: Any) -> ShardContribution:
        out = super().contribution(model_state, plan)
        factor = 2.0 if self.index == 0 else 1.0
        return ShardContribution(out.index, {k: factor * v for k, v in out.sums.items()}, out.seen)


def sharded_audit(shard_class: type[Shard] = Shard) -> tuple[Any, float, Any]:
    pair = pair_sensitivity(SPEC)
    seeds = np.random.SeedSequence(SEED).generate_state(2)
    sides = [ShardedTrials(rec, int(s), shard_class) for rec, s in zip((pair.record_a, pair.record_b), seeds)]
    assert sides[0].event == sides[1].event
    train = [side(N_TRAIN) for side in sides]
    test = [side(N_TEST) for side in sides]
    claim = claimed_epsilon(sides[0].event, AUDIT_DELTA)
    return audit_samples(train[0], train[1], test[0], test[1], AUDIT_DELTA, claim), claim, (pair, sides)


def test_the_sharded_release_stays_below_its_claim_and_the_audit_sees_it() -> None:
    result, claim, (pair, sides) = sharded_audit()
    # the claim is about the one-process event: same z, q, sampling, adjacency and diameter
    one_process = trials(SPEC, pair.record_a, seed=0, delta=AUDIT_DELTA)
    assert sides[0].event == one_process.event
    assert claim == pytest.approx(claimed_epsilon(one_process.event, AUDIT_DELTA))
    assert result.epsilon_lower_bound <= claim, result.to_dict()
    ideal = ideal_lower_bound(pair.sensitivity, result.n_test, result.delta, 1.0, result.confidence)
    assert result.epsilon_lower_bound >= 0.5 * ideal, (result.to_dict(), ideal)


def test_a_slice_counted_twice_is_caught() -> None:
    result, claim, _ = sharded_audit(DoubleCounting)
    assert result.epsilon_lower_bound > claim, result.to_dict()
