"""Utility of the sharded runtime: a 2-shard run of logistic regression and of LDA reaches the
one-process run's held-out metric within seed noise.

The two runs are the same mechanism (privacy rule 14), so over seeds their metrics are draws from
one distribution. Each family runs K seeds one-process and K seeds on two local shards, on the
same synthetic data (the family's own ``synthetic`` generator and held-out draw, its ``demo``
score). The tolerance is the two-sided 99.9% bound of a difference of two means of K draws,
t_{0.9995, K-1} s sqrt(2 / K), with s the seed-to-seed standard deviation of the one-process
runs: nothing in it is chosen by hand but the level. Both runs must also have learned (better
than the untrained model by many s), so two broken runs cannot agree by being equally bad.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import stats

from stream_vips.core.learner import PrivateLearner
from stream_vips.distributed import LocalPool, ShardedLearner
from stream_vips.models import registry
from stream_vips.service.build import config_from_dict

SEEDS = (11, 12, 13, 14, 15, 16)
SHARDS = 2

# small versions of each family's demo: (generator options, M, S, every_records, steps, epsilon)
CASES: dict[str, dict[str, Any]] = {
    "logistic": {"source": {"dimension": 5}, "reservoir": 1000, "batch_size": 250, "every": 250, "steps": 10,
                 "epsilon": 2.0, "held_out": lambda data: data.sample(4000)},
    "lda": {"source": {"n_topics": 3, "vocabulary_size": 30, "doc_length": 20, "alpha": 0.2},
            "reservoir": 600, "batch_size": 200, "every": 150, "steps": 8, "epsilon": 4.0,
            "held_out": lambda data: [{"tokens": doc} for doc in data.documents(150)]},
}


def family_class(name: str) -> Any:
    return registry.model_class(name)


def settings(family: str, data: Any, seed: int, shards: int) -> dict[str, Any]:
    case = CASES[family]
    cls = family_class(family)
    return {
        "model": {"family": family, "params": cls.demo.params(data, 0)},
        "sampling": {"reservoir": case["reservoir"], "batch_size": case["batch_size"], "method": "poisson"},
        "schedule": {"every_records": case["every"]},
        "privacy": {"epsilon": case["epsilon"], "delta": 1e-5, "planned_steps": case["steps"], "seed": seed,
                    "ledger": {"type": "memory"}},
        "runtime": {"shards": shards},
    }


def score(family: str, model: Any, data: Any, held_out: Any) -> float:
    """The demo's headline metric, oriented so that larger is better."""
    scores = family_class(family).demo.score(model, data, held_out)
    return scores["auc"] if family == "logistic" else -scores["perplexity"]


def run(family: str, seed: int, shards: int) -> tuple[float, int, float]:
    """One run on the family's synthetic data (fixed data seed): held-out metric, steps, and the
    metric of the untrained model."""
    case = CASES[family]
    data = family_class(family).synthetic(np.random.default_rng(2024), **case["source"])
    lines = data.records(case["reservoir"] + case["every"] * (case["steps"] - 1))
    held_out = case["held_out"](data)
    cfg = config_from_dict(settings(family, data, seed, shards), env={})
    chunk = 50
    if shards == 1:
        learner: Any = PrivateLearner.from_config(cfg)
        untrained = score(family, learner.model, data, held_out)
        for start in range(0, len(lines), chunk):
            learner.feed(lines[start:start + chunk])
    else:
        learner = ShardedLearner(cfg, LocalPool(cfg, shards))
        untrained = score(family, learner.model, data, held_out)
        for start in range(0, len(lines), chunk):
            part = lines[start:start + chunk]
            learner.feed([part[i::shards] for i in range(shards)])
    with learner:
        return score(family, learner.model, data, held_out), learner.steps_taken, untrained


@pytest.mark.parametrize("family", sorted(CASES))
def test_two_shards_reach_the_one_process_metric_within_seed_noise(family: str) -> None:
    single = [run(family, seed, 1) for seed in SEEDS]
    two = [run(family, seed, SHARDS) for seed in SEEDS]
    steps = CASES[family]["steps"]
    assert all(s == steps for _, s, _ in single + two), "every run takes the planned steps"
    a = np.array([m for m, _, _ in single])
    b = np.array([m for m, _, _ in two])
    k = len(SEEDS)
    spread = float(a.std(ddof=1))
    assert spread > 0, "seeded runs that do not differ say nothing about noise"
    bound = float(stats.t.ppf(0.9995, k - 1)) * spread * np.sqrt(2.0 / k)
    assert abs(b.mean() - a.mean()) <= bound, (family, a, b, bound)
    untrained = single[0][2]
    assert a.mean() - untrained > 5 * spread and b.mean() - untrained > 5 * spread, (untrained, a, b)
