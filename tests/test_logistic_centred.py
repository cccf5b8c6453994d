"""The centred release of VIPS logistic regression: bounds, diameter, fixed point, state, fit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_vips.models.logistic import BayesianLogisticRegression, joint_diameter
from test_logistic import batch_vb, synthetic

C2 = 0.25


def set_posterior(model, Sigma, mu=None):
    """Public state with covariance ``Sigma`` around mean and iterate ``mu`` (default 0), no noise."""
    d = Sigma.shape[0]
    mu = np.zeros(d) if mu is None else mu
    P = np.linalg.inv(Sigma)
    P = (P + P.T) / 2
    A = 1e-30
    model.load_state({"h": P @ mu, "precision": P, "s2_blend": P - A * np.eye(d),
                      "alpha": np.array([1.0, 1.0, A]), "noise_var": np.array([0.0]),
                      "iterate": mu, "mean_sum": np.zeros(d), "counts": np.zeros(3)})


def centred(d, n, **kw):
    return BayesianLogisticRegression(d, n, release="centred", **kw)


def one(model, x, y):
    return model.clipped_sum({"x": np.asarray(x, dtype=float)[None, :], "y": np.array([float(y)])})


def test_blocks_name_g_with_the_residual_clip_as_bound():
    model = centred(3, 10, residual_clip=0.7)
    assert [(b.name, b.bound) for b in model.blocks()] == [("g", 0.7), ("s2", 0.25)]
    with pytest.raises(ValueError, match="g and s2"):
        model.diameter({"s1": 1.0, "s2": 1.0})
    with pytest.raises(ValueError, match="release"):
        BayesianLogisticRegression(3, 10, release="residual")
    with pytest.raises(ValueError, match="step_size"):
        centred(3, 10, step_size=1.5)
    with pytest.raises(ValueError, match="centred' only"):
        BayesianLogisticRegression(3, 10, residual_clip=0.1)


def test_first_step_releases_s1_exactly():
    """At the start (iterate 0) the residual is y - 1/2, so g equals the s1 of the sums release."""
    rng = np.random.default_rng(1)
    X, y = synthetic(rng, 200, 5)
    a, c = BayesianLogisticRegression(5, 200), centred(5, 200)
    sa, sc = a.clipped_sum({"x": X, "y": y}), c.clipped_sum({"x": X, "y": y})
    np.testing.assert_allclose(sc["g"], sa["s1"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(sc["s2"], sa["s2"], rtol=1e-12, atol=1e-15)


def test_the_residual_is_taken_at_the_iterate_not_at_the_published_mean():
    """g linearises the E-step at the iterate m_t (the mean the steps move), with c^2 =
    (x^T m_t)^2 + x^T Sigma x; the published mean (here 0) must not enter it."""
    from stream_vips.models.logistic import pg_mean

    model = centred(2, 10)
    Sigma = np.array([[0.5, 0.1], [0.1, 0.3]])
    iterate = np.array([1.5, -0.7])
    set_posterior(model, Sigma, iterate)
    state = model.state()
    state["h"] = np.zeros(2)  # the published mean is 0, the iterate is not
    model.load_state(state)
    assert np.allclose(model.mu, 0.0) and np.allclose(model.state()["iterate"], iterate)
    X = np.array([[0.6, 0.8], [-0.3, 0.2], [0.0, 1.0]])
    y = np.array([1.0, 0.0, 0.0])
    xm = X @ iterate
    omega = pg_mean(np.sqrt(xm**2 + np.einsum("ij,jk,ik->i", X, model.Sigma, X)))
    expected = np.clip(y - 0.5 - omega * xm, -0.5, 0.5) @ X
    np.testing.assert_allclose(model.clipped_sum({"x": X, "y": y})["g"], expected, rtol=1e-12)
    assert np.abs(expected - (y - 0.5) @ X).max() > 0.1  # at the mean 0 it would be s1

@pytest.mark.parametrize("clip", [0.25, 0.5, 1.0])
def test_per_record_bound_holds_at_hostile_iterates(clip):
    """Whatever the (public) iterate and covariance, each record's g has norm <= C_r; with C_r = 1
    the clip never binds, since |y - 1/2 - E[omega] x^T m| < 1."""
    rng = np.random.default_rng(2)
    d = 4
    model = centred(d, 10, residual_clip=clip)
    worst = 0.0
    for _ in range(300):
        A = rng.normal(size=(d, d)) * rng.choice([1e-6, 1.0, 1e4])
        mu = rng.normal(size=d) * rng.choice([0.0, 1.0, 1e3, 1e8])
        set_posterior(model, A @ A.T + 1e-8 * np.eye(d), mu)
        x = rng.normal(size=d) * rng.choice([0.1, 1.0, 50.0])
        g = one(model, x, rng.integers(2))["g"]
        worst = max(worst, float(np.linalg.norm(g)))
    assert worst <= clip * (1 + 1e-12)
    assert worst > 0.9 * clip  # the bound is approached, so the test could fail


def test_diameter_is_the_joint_diameter_and_bounds_real_neighbours():
    """Proof in the module docstring: the (g, s2) release has the diameter of (s1, s2) with C1 = C_r.
    Real neighbours at random public states never exceed it, and a near-worst pair approaches it."""
    d, clip = 4, 0.5
    model = centred(d, 10, residual_clip=clip)
    rng = np.random.default_rng(3)
    for _ in range(400):
        w = rng.uniform(0.05, 1, 2)
        w /= np.linalg.norm(w)
        D = model.diameter({"g": w[0], "s2": w[1]})
        assert D == joint_diameter(*w)
        A = rng.normal(size=(d, d)) * rng.choice([1e-4, 1.0, 100.0])
        mu = rng.normal(size=d) * rng.choice([0.0, 1.0, 30.0])
        set_posterior(model, A @ A.T + 1e-8 * np.eye(d), mu)
        xa = rng.normal(size=d) * 5
        xb = rng.normal(size=d) * 5 if rng.random() < 0.5 else -xa
        sa, sb = one(model, xa, rng.integers(2)), one(model, xb, rng.integers(2))
        dist = math.sqrt((w[0] / clip) ** 2 * np.sum((sa["g"] - sb["g"]) ** 2)
                         + (w[1] / C2) ** 2 * np.sum((sa["s2"] - sb["s2"]) ** 2))
        assert dist <= D * (1 + 1e-12)
    # at the iterate 0 with a tiny covariance: x and -x with the same label give g = +-x/2 and
    # omega ~ 1/4 for both, the 4 a1^2 corner of the closed form (up to the s2 part, which cancels)
    w = (math.sqrt(0.8), math.sqrt(0.2))
    set_posterior(model, 1e-12 * np.eye(d))
    x = np.eye(d)[0]
    sa, sb = one(model, x, 1), one(model, -x, 1)
    dist = math.sqrt((w[0] / clip) ** 2 * np.sum((sa["g"] - sb["g"]) ** 2)
                     + (w[1] / C2) ** 2 * np.sum((sa["s2"] - sb["s2"]) ** 2))
    assert dist == pytest.approx(2 * w[0], rel=1e-6)


def test_noiseless_iterates_reach_the_batch_vb_fixed_point():
    """Without noise and with a clip that never binds, the preconditioned steps settle where
    N g = A m: the batch VB posterior mean, whatever the preconditioner. (rho = 1, so that A is the
    current <alpha> as in batch VB rather than an average over the steps.)"""
    rng = np.random.default_rng(4)
    n, d = 400, 3
    X, y = synthetic(rng, n, d)
    model = centred(d, n, residual_clip=1.0, step_size=0.5, average_from=150)
    for _ in range(200):
        model.update({k: v / n for k, v in model.clipped_sum({"x": X, "y": y}).items()}, rho=1.0)
    mu, _, _ = batch_vb(X, y, 1.0, 1.0)
    np.testing.assert_allclose(model._iterate, mu, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(model.mu, mu, rtol=1e-6, atol=1e-9)  # the average of settled iterates


def test_published_mean_averages_the_iterates_after_average_from():
    rng = np.random.default_rng(5)
    n, d = 300, 3
    X, y = synthetic(rng, n, d)
    model = centred(d, n, average_from=2)
    seen = []
    for t in range(5):
        model.update({k: v / n for k, v in model.clipped_sum({"x": X, "y": y}).items()}, rho=1.0 / (t + 1))
        seen.append(model._iterate.copy())
    np.testing.assert_allclose(model.mu, np.mean(seen[2:], axis=0), rtol=1e-10)
    np.testing.assert_allclose(model._h, model._P @ model.mu, rtol=1e-10)


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(6)
    n, d = 300, 3
    X, y = synthetic(rng, n, d)
    model = centred(d, n, average_from=1)
    def step(m, t):
        m.update({k: v / n for k, v in m.clipped_sum({"x": X, "y": y}).items()}, 1.0 / (t + 1))

    for t in range(3):
        step(model, t)
    hp = model.hyperparameters()
    hp.pop("s2_noise_std")
    restored = BayesianLogisticRegression(**hp)
    state = model.state()
    assert set(state) == set(BayesianLogisticRegression.state_shapes(model.hyperparameters()))
    restored.load_state(state)
    for t in range(3, 6):
        step(model, t)
        step(restored, t)
    np.testing.assert_array_equal(restored.mu, model.mu)
    for counts in ([1.0, 2.0, 1.0], [2.0, 1.0, 0.0], [1e300, 1e300, 1.0], [1.5, 1.0, 1.0]):
        with pytest.raises(ValueError, match="counts"):
            restored.load_state(dict(state, counts=np.array(counts)))
    with pytest.raises(ValueError, match="iterate"):
        restored.load_state({k: v for k, v in state.items() if k != "iterate"})


def test_sums_release_keeps_its_hyperparameters_and_state():
    """The default release publishes exactly what it did before the centred release existed."""
    model = BayesianLogisticRegression(3, 10)
    assert "release" not in model.hyperparameters()
    assert set(model.state()) == {"h", "precision", "s2_blend", "alpha", "noise_var"}


def test_key_level_sums_respect_the_residual_clip():
    rng = np.random.default_rng(7)
    d, clip = 3, 0.5
    model = centred(d, 10, residual_clip=clip)
    mu = np.array([40.0, -30.0, 5.0])
    set_posterior(model, np.eye(d), mu)
    X = rng.normal(size=(60, d))
    y = rng.integers(2, size=60).astype(float)
    groups = np.repeat(np.arange(6), 10)
    total = model.group_clipped_sum({"x": X, "y": y}, groups, 6)
    per_key = [model.group_clipped_sum({"x": X[groups == k], "y": y[groups == k]},
                                       np.zeros(10, dtype=int), 1) for k in range(6)]
    assert max(np.linalg.norm(s["g"]) for s in per_key) <= clip * (1 + 1e-12)
    np.testing.assert_allclose(total["g"], sum(s["g"] for s in per_key), rtol=1e-10)


def test_fit_with_the_centred_release_spends_the_budget_and_publishes_a_readable_model():
    """``fit(..., release="centred")`` takes the centred settings (stage D's best), spends the whole
    budget with z calibrated for its 32 steps at the (g, s2) diameter, and the message reads back."""
    import json

    from stream_vips import fitting
    from stream_vips.client import posterior_from_message

    rng = np.random.default_rng(8)
    X, y = synthetic(rng, 3000, 6)
    res = fitting.fit((X, y), "logistic", 1.0, 1e-5, release="centred", seed=3)
    c = fitting.CENTRED_LOGISTIC
    assert res.settings.steps == c["steps"] and res.settings.block_weights == c["weights"]
    assert res.settings.model_params["average_from"] == int(c["steps"] * (1 - c["averaged_share"]))
    assert "release" in res.settings.why and "set by" not in res.settings.why["release"]
    budget = res.report["budget"]
    assert 1.0 / (1 + fitting.CALIBRATION_RTOL) ** 2 <= budget["epsilon_spent"] <= 1.0
    D = joint_diameter(*(np.array([1.0, 1.0]) / math.sqrt(2)))
    mu_gdp = math.sqrt(c["steps"]) * D / budget["noise_multiplier"]
    assert 0.26 < mu_gdp < 0.275  # epsilon 1, delta 1e-5 is mu-GDP at mu = 0.268
    model = posterior_from_message(json.loads(json.dumps(res.message))).model
    assert model.release == "centred"
    np.testing.assert_array_equal(model.mu, res.posterior.model.mu)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_iterate_the_e_step_cannot_represent_is_refused_and_the_residual_stays_bounded(dtype):
    """A state whose mean overflows x^T m in the E-step's precision is refused at load; and should
    x^T m still be infinite or NaN, the residual is bounded (its limit, or 0), never NaN."""
    d = 4
    model = centred(d, 10, dtype=dtype)
    huge = np.full(d, np.finfo(dtype).max / 3)
    with pytest.raises(ValueError, match="too large"):
        set_posterior(model, np.eye(d), huge)
    r = model._residual(np.array([0.5, -0.5, 0.5, 0.5]), np.zeros(4), np.array([np.inf, np.inf, -np.inf, np.nan]))
    np.testing.assert_array_equal(r, [0.0, -0.5, 0.5, 0.0])


def test_a_first_step_below_one_does_not_overshoot():
    """Under a streaming schedule (rho_0 < 1) the preconditioner uses the blend divided by its
    weight, so the first centred step still lands where the s1 release at rho = 1 does."""
    rng = np.random.default_rng(9)
    n, d = 500, 3
    X, y = synthetic(rng, n, d)
    sums, c = BayesianLogisticRegression(d, n), centred(d, n)
    sums.update({k: v / n for k, v in sums.clipped_sum({"x": X, "y": y}).items()}, rho=1.0)
    c.update({k: v / n for k, v in c.clipped_sum({"x": X, "y": y}).items()}, rho=0.04)
    np.testing.assert_allclose(c._iterate, sums.mu, rtol=1e-9)
    assert c.state()["counts"][2] == pytest.approx(0.04)


def test_fit_overrides_of_the_centred_release_are_what_runs_and_what_is_reported():
    """--steps moves the averaged share with it; a caller's residual_clip is in the settings and
    the reason (so passing the settings back reproduces the run)."""
    from stream_vips import fitting

    rng = np.random.default_rng(10)
    X, y = synthetic(rng, 600, 4)
    res = fitting.fit((X, y), "logistic", 1.0, 1e-5, release="centred", steps=200, residual_clip=1.0, seed=0)
    share = fitting.CENTRED_LOGISTIC["averaged_share"]
    assert res.settings.steps == 200
    assert res.settings.model_params["average_from"] == int(200 * (1 - share))
    assert res.settings.model_params["residual_clip"] == 1.0 and "+-1.0)" in res.settings.why["release"]
    assert res.posterior.model.residual_clip == 1.0


def test_fit_refusals_of_the_centred_release_are_one_line_and_spend_nothing(tmp_path):
    """Bad values reach the model's own one-line checks (not a formatting traceback), a bad step
    count is a FitError, and a mean that would average no iterate is refused before any step."""
    from stream_vips import fitting
    from stream_vips.errors import StreamVipsError

    rng = np.random.default_rng(11)
    X, y = synthetic(rng, 300, 3)
    ledger = tmp_path / "ledger.jsonl"
    cases = ({"residual_clip": None}, {"step_size": [0.5]}, {"steps": float("inf")},
             {"steps": 6, "average_from": 20}, {"steps": 6})
    for kw in cases:
        with pytest.raises(StreamVipsError) as info:
            fitting.fit((X, y), "logistic", 1.0, 1e-5, release="centred", ledger_path=str(ledger),
                        **({"average_from": 8} if kw == {"steps": 6} else {}), **kw)
        assert "\n" not in str(info.value)
        assert not ledger.exists() or ledger.read_text().count("\n") <= 1  # no step was paid


def test_a_refused_state_leaves_the_model_as_it_was():
    rng = np.random.default_rng(12)
    n, d = 200, 3
    X, y = synthetic(rng, n, d)
    model = centred(d, n, dtype="float32")
    model.update({k: v / n for k, v in model.clipped_sum({"x": X, "y": y}).items()}, rho=1.0)
    before = model.state()
    bad = dict(before, h=model._P @ np.full(d, 1e38), iterate=np.full(d, 1e38))
    with pytest.raises(ValueError, match="too large"):
        model.load_state(bad)
    tiny = dict(before, counts=np.array([1.0, 0.0, 5e-324]))
    with pytest.raises(ValueError):
        model.load_state(tiny)
    after = model.state()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
