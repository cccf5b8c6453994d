"""Constructor checks shared by the model families (stream_vips.models._validate)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_vips.models._validate import integer, optional_positive, positive


def test_positive_accepts_finite_positive_numbers_of_any_numeric_type():
    assert positive("clip", 2) == 2.0 and isinstance(positive("clip", 2), float)
    assert positive("clip", np.float32(0.5)) == 0.5
    assert positive("clip", np.int64(3)) == 3.0
    assert optional_positive("x_clip", None) is None
    assert optional_positive("x_clip", 1.5) == 1.5


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True, "1.0", None, [1.0]])
def test_positive_names_the_key(bad):
    with pytest.raises(ValueError, match=r"^clip must be a finite number > 0, got "):
        positive("clip", bad)


def test_integer_bounds_and_wording():
    assert integer("dim", np.int32(4)) == 4 and type(integer("dim", np.int32(4))) is int
    assert integer("burn_in", 0, minimum=0) == 0
    with pytest.raises(ValueError, match=r"^dim must be a positive integer, got 0$"):
        integer("dim", 0)
    with pytest.raises(ValueError, match=r"^mcmc_steps must be an integer >= 2, got 1$"):
        integer("mcmc_steps", 1, minimum=2)
    for bad in (True, 2.0, "3", None):
        with pytest.raises(ValueError, match="dim"):
            integer("dim", bad)


@pytest.mark.parametrize("family", sorted(__import__("stream_vips.audit.families", fromlist=["x"]).FAMILY_AUDITS))
def test_a_model_state_after_heavy_noise_loads(family):
    """Noise can push any released mean outside its noiseless range; the model uses it as released
    (post-processing), so its own state -- what checkpoints and model messages carry -- must load
    again. A refused state fails only after the budget was spent (sbn refused a negative blended
    xi this way). Five updates at 20 block bounds of noise per entry, three noise seeds."""
    from stream_vips.audit.families import FAMILY_AUDITS

    spec = FAMILY_AUDITS[family]
    for seed in range(3):
        rng = np.random.default_rng(seed)
        model = spec.make_model(spec.capacity)
        sums = model.clipped_sum(model.parse_batch(list(spec.candidates)[: spec.batch_size]).rows)
        stds = {b.name: 20.0 * b.bound / spec.batch_size for b in model.blocks()}
        if hasattr(model, "set_noise_scale"):
            model.set_noise_scale(stds)
        for t in range(5):
            model.update({b.name: sums[b.name] / spec.batch_size + stds[b.name] * rng.standard_normal(b.shape)
                          for b in model.blocks()}, 1.0 / (t + 1))
        state = model.state()
        restored = spec.make_model(spec.capacity)
        restored.load_state(state)
        for name, value in restored.state().items():
            np.testing.assert_allclose(value, state[name], rtol=1e-12, atol=0, err_msg=f"{family}: {name}")


@pytest.mark.parametrize("family", sorted(__import__("stream_vips.audit.families", fromlist=["x"]).FAMILY_AUDITS))
def test_an_empty_batch_gives_zero_sums_and_an_update(family):
    """A Poisson batch can be empty (probability (1 - q)^M per step: about 4e-5 at 10 records
    expected, so a fit of 2,000 steps met one 8% of the time). Its clipped sums are zeros of the
    blocks' shapes and the update on the noise alone runs; sep_bnn raised in ``clipped_sum``
    mid-fit, after earlier steps were paid."""
    from stream_vips.audit.families import FAMILY_AUDITS

    spec = FAMILY_AUDITS[family]
    model = spec.make_model(spec.capacity)
    parsed = model.parse_batch(list(spec.candidates)[:1])
    sums = model.clipped_sum({k: v[:0] for k, v in parsed.rows.items()})
    for b in model.blocks():
        assert sums[b.name].shape == b.shape and not np.any(sums[b.name]), (family, b.name)
    rng = np.random.default_rng(0)
    model.update({b.name: 0.01 * b.bound * rng.standard_normal(b.shape) for b in model.blocks()}, 0.5)
