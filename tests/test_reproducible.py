"""A seeded run is reproducible, for every family that releases through the engine.

Each family learns privately from a small set of its own synthetic records (its ``synthetic``
hook), a few steps through :class:`~stream_vips.PrivateLearner`, twice with the same
``seed=`` and once with another. Its own seed parameter (``Model.seed_param``: lda's initial
topics and resampling, dpvi's Monte Carlo draws) is left at the constructor's default, so the
run's seed alone must decide the family's public randomness as well as the noise
(:func:`stream_vips.core.build.model_params`). The messages must be equal up to the wall-clock
``created_at`` and the ledger's id: the same natural parameters (bytes of their encoding), summary and privacy
section; another seed must change the natural parameters. ops releases a sample of its own, not
through the engine, and is not run here.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from stream_vips import PrivateLearner
from stream_vips.config import config_from_dict
from stream_vips.core.build import model_params, model_seed
from stream_vips.models import MODEL_FAMILIES, model_class

FAMILIES = [f for f in MODEL_FAMILIES if model_class(f).engine_refusal is None]
#: Reservoir capacity, records streamed, sampling and update cadence: a step at the fill and
#: every EVERY records after it.
RESERVOIR, RECORDS, BATCH, EVERY = 64, 128, 32, 16
STEPS = 1 + (RECORDS - RESERVOIR) // EVERY
#: One noise multiplier for every family: the noise level does not matter here, and 100 meets each
#: family's own floor (sgld's Algorithm 2 needs about 74 with its rule's step size at N = 64).
NOISE_MULTIPLIER = 100.0
#: Smaller models than the fit rule's, to keep the E-steps cheap (the synthetic data's own sizes).
SMALLER: dict[str, dict[str, Any]] = {"lda": {"doc_length": 20, "n_topics": 3}, "sbn": {"n_latent": 3}}
#: Fields of a message that name the moment or the ledger instance, not the run: the clock and
#: the privacy section's ledger id (a fresh in-memory ledger's random name).
CLOCK_FIELDS = ("created_at",)
LEDGER_FIELDS = ("ledger_id",)


def learner_messages(family: str, seed: int) -> dict[str, Any]:
    """The message of a private run of ``family`` on its synthetic records (data drawn with seed 0)."""
    cls = model_class(family)
    assert cls.synthetic is not None, f"{family} has no synthetic data to run on"
    data = cls.synthetic(np.random.default_rng(0))
    dim = data.model_params[cls.dim_param]
    d = cls.dimension_of(dim) if cls.dimension_of is not None else int(dim)
    params = dict(cls.fit_rule(RESERVOIR, d, 1.0, 1e-5, False).model_params)
    params.pop(cls.seed_param or "", None)  # the family's own default: the run's seed decides it
    params.update(data.model_params)
    params.update(SMALLER.get(family, {}))
    config = config_from_dict({  # a configuration, not keywords: sgld has a model parameter batch_size
        "model": {"family": family, "params": params},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "planned_steps": STEPS, "seed": seed,
                    "noise_multiplier": NOISE_MULTIPLIER, "ledger": {"type": "memory"}},
        "sampling": {"method": "fixed", "reservoir": RESERVOIR, "batch_size": BATCH},
        "schedule": {"every_records": EVERY}, "metrics": {"enabled": False}}, env={})
    learner = PrivateLearner(config=config)
    records = [json.loads(line) for line in data.records(RECORDS)]
    learner.learn_many(records)
    assert learner.steps_taken == STEPS, f"{family}: {learner.steps_taken} steps, expected {STEPS}"
    message = learner.message(False)
    out = {k: v for k, v in message.items() if k not in CLOCK_FIELDS}
    out["privacy"] = {k: v for k, v in out["privacy"].items() if k not in LEDGER_FIELDS}
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_a_seeded_run_is_reproduced_and_another_seed_differs(family: str) -> None:
    first, again, other = learner_messages(family, 7), learner_messages(family, 7), learner_messages(family, 8)
    assert first["privacy"]["seeded"] is True
    assert json.dumps(first, sort_keys=True) == json.dumps(again, sort_keys=True)
    assert first["natural_parameters"] != other["natural_parameters"]
    # the family's seed derived from the run's is a function of the noise seed: never published
    assert model_seed(7) not in first["hyperparameters"].values()


def test_the_model_seed_is_its_own_stream() -> None:
    """The derived seed is a 32-bit draw that changes with the run's seed and differs from the
    first draw of the run's own generator (which the reservoir's and the engine's descend from)."""
    seeds = {model_seed(s) for s in range(50)}
    assert len(seeds) == 50 and all(0 <= s < 2**32 for s in seeds)
    assert model_seed(7) != int(np.random.SeedSequence(7).generate_state(1)[0])


#: The families whose own seed defaults to None: a seeded run derives it (lda and dpvi: OS
#: entropy unseeded; sbn: 0 unseeded).
DERIVED = {"lda": {"vocabulary": ["a", "b", "c"]}, "sbn": {"n_visible": 4, "n_latent": 2}, "dpvi": {"dim": 2}}


def config_of(family: str, run_seed: int | None, **params: Any) -> Any:
    return config_from_dict({"model": {"family": family, "params": {**DERIVED[family], **params}},
                             "privacy": {"seed": run_seed, "ledger": {"type": "memory"}}}, env={})


@pytest.mark.parametrize("family", sorted(DERIVED))
def test_a_seeded_run_gives_the_family_its_derived_seed_and_keeps_a_given_one(family: str) -> None:
    assert model_params(config_of(family, 7))["seed"] == model_seed(7)
    assert model_params(config_of(family, None)).get("seed") is None  # unseeded: the family's default
    assert model_params(config_of(family, 7, seed=3))["seed"] == 3


@pytest.mark.parametrize("non_private", [True, False])
def test_the_lda_estimator_is_reproduced_from_its_random_state(non_private: bool) -> None:
    """The same random_state gives the same topics (the model's seed follows it through fit), also
    non-private, where no noise is drawn and the initial topics and resampling are all the randomness."""
    from stream_vips.estimators import PrivateLDA

    rng = np.random.default_rng(0)
    topics = np.array([[0.4, 0.4, 0.1, 0.1], [0.1, 0.1, 0.4, 0.4]])
    X = np.vstack([rng.multinomial(20, topics[k]) for k in rng.integers(0, 2, 200)])

    def components(random_state: int) -> np.ndarray:
        est = PrivateLDA(epsilon=1.0, n_components=2, doc_length=10, steps=3, non_private=non_private,
                         random_state=random_state)
        return np.asarray(est.fit(X).components_)

    first = components(3)
    np.testing.assert_array_equal(first, components(3))
    assert not np.array_equal(first, components(4))


def test_the_sbn_estimator_is_reproduced_from_its_random_state() -> None:
    """sbn's initial W follows random_state through fit (it was fixed at seed 0 whatever the state)."""
    from stream_vips.estimators import PrivateSigmoidBeliefNetwork

    X = (np.random.default_rng(0).random((200, 6)) < 0.3).astype(float)

    def codes(random_state: int) -> np.ndarray:
        est = PrivateSigmoidBeliefNetwork(n_components=2, steps=2, non_private=True, random_state=random_state)
        return np.asarray(est.fit(X).transform(X[:20]))

    first = codes(3)
    np.testing.assert_array_equal(first, codes(3))
    assert not np.array_equal(first, codes(4))
