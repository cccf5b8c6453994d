"""Every constructor parameter of the families a data scientist meets through PrivateLearner has a
documented default, or its omission is one line naming ``model.params.<name>``."""

from __future__ import annotations

import inspect

import pytest

from stream_vips import PrivateLearner
from stream_vips.config import ConfigError, config_from_dict
from stream_vips.models import model_class

FAMILIES = ("sgld", "dpvi", "sep_probit", "sep_bnn")
#: The parameters that stay required: d is public schema, N the reservoir (the learner fills it).
REQUIRED = {"dim", "dataset_size"}


@pytest.mark.parametrize("family", FAMILIES)
def test_only_dim_and_dataset_size_are_required(family):
    params = inspect.signature(model_class(family).__init__).parameters
    required = {n for n, p in params.items() if n != "self" and p.default is p.empty}
    assert required == REQUIRED


@pytest.mark.parametrize("family", FAMILIES)
def test_omitting_dim_is_one_line_naming_the_key_through_the_learner_and_a_config(family):
    with pytest.raises(ConfigError) as by_learner:
        PrivateLearner(family, reservoir=200, batch_size=20)
    cfg = {"model": {"family": family, "params": {}}, "privacy": {"ledger": {"type": "memory"}}}
    with pytest.raises(ConfigError) as by_config:
        PrivateLearner(config=config_from_dict(cfg, env={}))
    assert str(by_learner.value) == str(by_config.value) == "model.params.dim: required"


@pytest.mark.parametrize("family", FAMILIES)
def test_dim_alone_builds_and_dataset_size_is_the_reservoir(family):
    with PrivateLearner(family, dim=2, reservoir=200, batch_size=20, planned_steps=5) as lrn:
        assert lrn.model.dataset_size == 200
        assert lrn.engine.noise_multiplier > 0  # calibrated to the budget, nothing else asked
