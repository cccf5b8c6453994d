"""Conjugate Bayesian linear regression: exact batch posterior at z = 0, clipping, bounds, parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from stream_vips.models.linreg import LinearRegression


def records(rng, n, d, w, noise=0.1):
    X = rng.normal(size=(n, d)) / np.sqrt(d)
    y = X @ w + noise * rng.normal(size=n)
    return [{"x": x.tolist(), "y": float(t)} for x, t in zip(X, y)]


def closed_form(X, y, alpha, m0, lam=None, a0=None, b0=None):
    """Textbook conjugate posterior (Bishop 3.3 / Murphy 7.6), written independently."""
    L0 = alpha * np.eye(X.shape[1])
    s = 1.0 if lam is None else lam
    Ln = L0 + s * X.T @ X
    mn = np.linalg.solve(Ln, L0 @ m0 + s * X.T @ y)
    if lam is not None:
        return Ln, mn, None, None
    an = a0 + len(y) / 2
    bn = b0 + 0.5 * (y @ y + m0 @ L0 @ m0 - mn @ Ln @ mn)
    return Ln, mn, an, bn


@pytest.mark.parametrize("noise", ["known", "gamma"])
def test_noiseless_full_batch_step_equals_batch_posterior(noise):
    rng = np.random.default_rng(0)
    d, n = 4, 300
    m = LinearRegression(d, n, noise=noise, noise_precision=50.0, prior_precision=2.0,
                         prior_mean=[0.1, 0, 0, -0.1], y_bound=1.5, a0=2.0, b0=0.5)
    parsed = m.parse_batch(records(rng, n, d, np.array([1.0, -0.5, 0.3, 0.0])))
    X, y = parsed.rows["x"], parsed.rows["y"]
    mean = {k: v / n for k, v in m.clipped_sum(parsed.rows).items()}  # z = 0, q = 1: normaliser M = N
    m.update(mean, rho=1.0)
    lam = 50.0 if noise == "known" else None
    Ln, mn, an, bn = closed_form(X, y, 2.0, np.array([0.1, 0, 0, -0.1]), lam, 2.0, 0.5)
    np.testing.assert_allclose(m.state()["precision"], Ln, rtol=0, atol=1e-8)
    np.testing.assert_allclose(m.posterior_mean(), mn, rtol=0, atol=1e-8)
    if noise == "gamma":
        assert float(m.state()["shape"]) == pytest.approx(an, abs=1e-8)
        assert m.noise_rate() == pytest.approx(bn, abs=1e-8)


def test_averaging_same_statistics_is_stationary_at_the_posterior():
    """With rho_t = 1/t, repeated noiseless full-batch steps average to the same posterior."""
    rng = np.random.default_rng(1)
    m = LinearRegression(3, 100, noise="gamma")
    parsed = m.parse_batch(records(rng, 100, 3, np.array([0.5, 0.5, -1.0])))
    mean = {k: v / 100 for k, v in m.clipped_sum(parsed.rows).items()}
    m.update(mean, 1.0)
    ref = m.state()
    for t in range(2, 6):
        m.update(mean, 1.0 / t)
    for k in ref:
        np.testing.assert_allclose(m.state()[k], ref[k], atol=1e-10)


def test_blend_is_convex_combination_of_natural_parameters():
    m = LinearRegression(2, 10)
    prior = m.state()
    stat = {"xx": np.array([[0.5, 0.1], [0.1, 0.3]]), "xy": np.array([0.2, -0.1])}
    m.update(stat, 0.25)
    np.testing.assert_allclose(m.state()["precision"], prior["precision"] + 0.25 * 10 * stat["xx"])
    np.testing.assert_allclose(m.state()["shift"], 0.25 * 10 * stat["xy"])


def test_projection_after_noise_keeps_a_valid_posterior():
    """Noise can make the target indefinite; post-processing projects it (never skips the step)."""
    m = LinearRegression(3, 1000, noise="gamma", prior_precision=0.5, b0=0.2)
    noisy = {"xx": -np.eye(3), "xy": np.array([1.0, 2.0, 3.0]), "yy": np.array(-5.0)}
    m.update(noisy, 1.0)
    assert np.linalg.eigvalsh(m.state()["precision"]).min() >= 0.5 - 1e-9
    assert m.noise_rate() >= 0.2 - 1e-9
    mean, var = m.predictive(np.eye(3))
    assert np.all(np.isfinite(mean)) and np.all(var > 0)


def test_clipping_of_x_and_y():
    m = LinearRegression(2, 10, y_bound=2.0, x_bound=1.0)
    parsed = m.parse_batch([{"x": [3.0, 4.0], "y": 10.0}, {"x": [0.3, 0.4], "y": -7.0},
                            {"x": [0.1, 0.0], "y": 0.5}])
    np.testing.assert_allclose(parsed.rows["x"], [[0.6, 0.8], [0.3, 0.4], [0.1, 0.0]])
    np.testing.assert_allclose(parsed.rows["y"], [2.0, -2.0, 0.5])
    # clipped_sum re-clips whatever it is given: bounds hold at the wall
    s = m.clipped_sum({"x": np.array([[30.0, 40.0]]), "y": np.array([100.0])})
    np.testing.assert_allclose(s["xx"], [[0.36, 0.48], [0.48, 0.64]])
    np.testing.assert_allclose(s["xy"], [1.2, 1.6])
    # both ends of y, in both paths (the per-key path with the y^2 block too)
    g = LinearRegression(2, 10, noise="gamma", y_bound=2.0, x_bound=1.0)
    wild = {"x": np.array([[0.6, 0.8], [0.3, 0.4]]), "y": np.array([-100.0, 1.0])}
    tame = {"x": wild["x"], "y": np.array([-2.0, 1.0])}
    keys = np.array([0, 1])
    for one, other in ((g.clipped_sum(wild), g.clipped_sum(tame)),
                       (g.group_clipped_sum(wild, keys, 2), g.group_clipped_sum(tame, keys, 2))):
        assert set(one) == {"xx", "xy", "yy"}
        for name in one:
            np.testing.assert_allclose(one[name], other[name])
    np.testing.assert_allclose(g.clipped_sum(tame)["xy"], [-2.0 * 0.6 + 0.3, -2.0 * 0.8 + 0.4])
    # within the bounds no key is scaled: the per-key sums are the plain sums, y^2 included
    per_key = g.group_clipped_sum(tame, np.array([0, 1]), 2)
    assert float(per_key["yy"]) == pytest.approx(4.0 + 1.0)
    np.testing.assert_allclose(per_key["xy"], g.clipped_sum(tame)["xy"])


def test_block_bounds_match_closed_form_and_are_attained():
    R, B = 1.5, 3.0
    m = LinearRegression(4, 10, noise="gamma", x_bound=R, y_bound=B)
    bounds = {b.name: b.bound for b in m.blocks()}
    assert bounds == {"xx": R**2, "xy": R * B, "yy": B**2}
    assert [b.symmetric for b in m.blocks()] == [True, False, False]
    assert m.joint_bound() == pytest.approx(np.sqrt(R**4 + R**2 * B**2 + B**4))
    assert m.diameter() == 2.0
    rng = np.random.default_rng(2)
    X = rng.normal(size=(500, 4)) * 10
    y = rng.normal(size=500) * 10
    rows = m.parse_batch([{"x": a.tolist(), "y": float(t)} for a, t in zip(X, y)]).rows
    per = [m.clipped_sum({"x": rows["x"][i : i + 1], "y": rows["y"][i : i + 1]}) for i in range(500)]
    for name, bound in bounds.items():
        norms = np.array([np.linalg.norm(p[name]) for p in per])
        assert norms.max() <= bound * (1 + 1e-12)
        assert norms.max() >= bound * (1 - 1e-12)  # heavy inputs get clipped onto the bound
    # replace-one: any two records move the joint release by at most diameter * C
    u = np.array([np.concatenate([p["xx"].ravel(), p["xy"], [p["yy"]]]) for p in per])
    diffs = np.linalg.norm(u[:250] - u[250:], axis=1)
    assert diffs.max() <= m.diameter() * m.joint_bound()


def test_known_precision_has_no_yy_block():
    m = LinearRegression(3, 10)
    assert [b.name for b in m.blocks()] == ["xx", "xy"]
    assert set(m.state()) == {"precision", "shift"}


def test_parse_batch_rejects_malformed_records_with_reasons():
    m = LinearRegression(2, 10, max_abs=1e6)
    objs = [
        {"x": [0.1, 0.2], "y": 1.0},            # ok
        [0.1, 0.2],                             # not_object
        {"y": 1.0},                             # missing_field
        {"x": "0.1,0.2", "y": 1.0},             # wrong_type
        {"x": [0.1, "a"], "y": 1.0},            # wrong_type
        {"x": [0.1, 0.2, 0.3], "y": 1.0},       # wrong_shape
        {"x": [[0.1], [0.2]], "y": 1.0},        # nested arrays: entries are not numbers
        {"x": [float("nan"), 0.2], "y": 1.0},   # non_finite
        {"x": [0.1, 0.2], "y": float("inf")},   # non_finite
        {"x": [0.1, 2e6], "y": 1.0},            # out_of_range
        {"x": [0.1, 0.2], "y": -1e7},           # out_of_range
        {"x": [0.1, 10**400], "y": 1.0},        # integer beyond float range
        {"x": [0.1, 0.2], "y": None},           # wrong_type
        {"x": [0.1, 0.2]},                      # missing_field (y)
        {"x": [0.3, 0.4], "y": 2},              # ok (int y)
    ]
    parsed = m.parse_batch(objs)
    assert parsed.accepted.tolist() == [0, 14]
    reasons = {i: r for i, r, _ in parsed.rejected}
    assert reasons == {
        1: "not_object", 2: "missing_field", 3: "wrong_type", 4: "wrong_type", 5: "wrong_shape",
        6: "wrong_type", 7: "non_finite", 8: "non_finite", 9: "out_of_range", 10: "out_of_range",
        11: "out_of_range", 12: "wrong_type", 13: "missing_field",
    }
    details = {i: d for i, _, d in parsed.rejected}
    assert "'x'" in details[5] and "expected 2" in details[5]
    np.testing.assert_allclose(parsed.rows["x"], [[0.1, 0.2], [0.3, 0.4]])
    np.testing.assert_allclose(parsed.rows["y"], [1.0, 1.0])  # y = 2 clipped to B = 1
    empty = m.parse_batch([])
    assert empty.rows["x"].shape == (0, 2) and empty.accepted.size == 0


def test_predictive_matches_monte_carlo_normal_gamma():
    """Student-t predictive mean/variance against sampling lam, w, y from the posterior."""
    rng = np.random.default_rng(3)
    m = LinearRegression(3, 50, noise="gamma", prior_precision=1.0, a0=3.0, b0=1.0)
    parsed = m.parse_batch(records(rng, 50, 3, np.array([1.0, 0.0, -1.0]), noise=0.3))
    m.update({k: v / 50 for k, v in m.clipped_sum(parsed.rows).items()}, 1.0)
    x = np.array([[0.5, -0.2, 0.1]])
    mean, var = m.predictive(x)
    st = m.state()
    a, b = float(st["shape"]), m.noise_rate()
    k = 400_000
    lam = rng.gamma(a, 1.0 / b, size=k)
    cov = np.linalg.inv(st["precision"])
    w = m.posterior_mean() + rng.multivariate_normal(np.zeros(3), cov, size=k) / np.sqrt(lam)[:, None]
    ys = w @ x[0] + rng.normal(size=k) / np.sqrt(lam)
    se_mean = ys.std() / np.sqrt(k)
    assert abs(ys.mean() - mean[0]) < 5 * se_mean
    # the sample variance of a t with 2a = 2 * 28 dof has a finite 4th moment; 5% is > 5 std errors here
    assert ys.var() == pytest.approx(var[0], rel=0.05)
    ll = m.predictive_logpdf(x, np.array([0.3]))
    dof = 2 * a
    scale = np.sqrt(b / a * (1 + x[0] @ cov @ x[0]))
    assert ll[0] == pytest.approx(stats.t.logpdf(0.3, dof, mean[0], scale))


def test_predictive_known_precision_closed_form():
    m = LinearRegression(2, 10, noise_precision=4.0, prior_precision=2.0)
    m.update({"xx": np.diag([0.5, 0.2]), "xy": np.array([0.3, -0.1])}, 1.0)
    Ln = 2.0 * np.eye(2) + 4.0 * 10 * np.diag([0.5, 0.2])
    mn = np.linalg.solve(Ln, 4.0 * 10 * np.array([0.3, -0.1]))
    x = np.array([[0.6, 0.8], [3.0, 4.0]])  # second row is clipped like a record
    mean, var = m.predictive(x)
    xc = np.array([[0.6, 0.8], [0.6, 0.8]])
    np.testing.assert_allclose(mean, xc @ mn)
    np.testing.assert_allclose(var, 0.25 + np.einsum("ij,jk,ik->i", xc, np.linalg.inv(Ln), xc))


def test_state_round_trip_and_validation():
    m = LinearRegression(2, 10, noise="gamma")
    m.update({"xx": np.eye(2) * 0.3, "xy": np.array([0.1, 0.2]), "yy": np.array(0.4)}, 0.5)
    other = LinearRegression(2, 10, noise="gamma")
    other.load_state(m.state())
    np.testing.assert_array_equal(other.posterior_mean(), m.posterior_mean())
    with pytest.raises(ValueError, match="shape"):
        other.load_state({**m.state(), "shift": np.zeros(3)})
    with pytest.raises(ValueError, match="missing statistic 'yy'"):
        m.update({"xx": np.eye(2), "xy": np.zeros(2)}, 0.5)
    with pytest.raises(ValueError, match="rho"):
        m.update({"xx": np.eye(2), "xy": np.zeros(2), "yy": np.array(0.0)}, 0.0)
    for kw, name in [({"dim": 0}, "dim"), ({"noise": "laplace"}, "noise"), ({"y_bound": -1}, "y_bound"),
                     ({"prior_mean": [1.0]}, "prior_mean"), ({"dataset_size": 0}, "dataset_size")]:
        args = {"dim": 2, "dataset_size": 10, **kw}
        with pytest.raises(ValueError, match=name):
            LinearRegression(**args)
    assert m.hyperparameters()["noise"] == "gamma"


class AdmitAll:
    """Budget monitor double: admits every step (the budget itself is tested elsewhere)."""

    epsilon_budget, delta, halted, halt_reason = 100.0, 1e-5, False, None

    def __init__(self) -> None:
        self.n = 0

    def admit(self, event, position=None):
        self.n += 1
        return self.n - 1

    def spent(self):
        return 0.0


def test_error_shrinks_as_epsilon_grows():
    """Private runs through the engine at three noise levels, T = 10 averaged Poisson steps.

    To first order the posterior mean m = precision^-1 shift moves by
    precision^-1 (d_shift - d_precision m), linear in the noise, so its error against the
    noiseless posterior over the same reservoir scales like z (epsilon grows as z shrinks).
    We require strictly decreasing errors, each error/z within a factor 2 of the others, and
    the accountant's epsilon strictly increasing (PLD, replace-one, delta 1e-5).
    """
    from stream_vips.core.data.reservoir import Reservoir
    from stream_vips.core.data.sampling import PoissonSampler
    from stream_vips.core.engine import PrivateEngine
    from stream_vips.privacy.accountants import PldAccountant
    from stream_vips.privacy.events import SubsampledGaussianEvent

    M, d, q, T = 2000, 3, 0.5, 10
    rng = np.random.default_rng(0)
    objs = records(rng, M, d, np.array([0.8, -0.5, 0.3]))
    zs = (16.0, 6.0, 2.0)
    acct = PldAccountant(value_discretization_interval=1e-3)
    eps = [acct.epsilon([SubsampledGaussianEvent(z, q, "poisson", "replace_one", 2.0, count=T)], 1e-5) for z in zs]
    assert eps[0] < eps[1] < eps[2]
    errors = []
    for z in zs:
        errs = []
        for seed in range(3):
            model = LinearRegression(d, M, noise_precision=100.0)
            res = Reservoir(model.row_layout(), M, np.random.default_rng(seed))
            res.add_batch(model.parse_batch(objs).rows)
            ref = LinearRegression(d, M, noise_precision=100.0)
            ref.update({k: v / M for k, v in ref.clipped_sum(res.take(np.arange(M))).items()}, 1.0)
            engine = PrivateEngine(model, res, PoissonSampler(q), AdmitAll(), z, np.random.default_rng(100 + seed),
                                   tau0=1.0, kappa=1.0, accountant_name="pld", seeded=True)
            for _ in range(T):
                engine.step()
            errs.append(np.linalg.norm(model.posterior_mean() - ref.posterior_mean()))
        errors.append(float(np.mean(errs)))
    assert errors[0] > errors[1] > errors[2]
    per_z = np.array(errors) / np.array(zs)
    assert per_z.max() / per_z.min() < 2.0


def test_reader_rebuilds_the_model_from_a_published_message():
    """hyperparameters() are the constructor's arguments: a reader needs nothing else."""
    from stream_vips import messages

    m = LinearRegression(2, 10, noise="gamma", prior_mean=[0.5, -0.5], y_bound=2.0)
    m.update({"xx": np.eye(2) * 0.3, "xy": np.array([0.1, 0.2]), "yy": np.array(0.4)}, 0.5)
    report = messages.privacy_report(epsilon_spent=0.1, delta=1e-5, epsilon_budget=1.0, accountant="pld",
                                     sampling="poisson", q=0.1, noise_multiplier=1.0, steps=1, halted=False,
                                     seeded=True)
    msg = messages.loads(messages.dumps(messages.build_message("a", m.family, m.hyperparameters(), 0, m.state(),
                                                               report)))
    reader = LinearRegression(**msg["hyperparameters"])
    reader.load_state(messages.decode_state(msg))
    X = np.array([[0.2, 0.1], [-0.3, 0.4]])
    for a, b in zip(reader.predictive(X), m.predictive(X)):
        np.testing.assert_array_equal(a, b)


def test_default_allocation_serves_the_posterior_mean():
    """The default allocation minimises the first-order error of the posterior mean
    std_xy^2 + std_xx^2 ||w||^2 (||w|| = B / R) over the xx/xy split, whatever R and B, and gives
    the y^2 block the budget share 1 / (d + 1); bound-proportional weights do worse when B != R."""
    from stream_vips.models.linreg import default_block_weights

    for d, R, B in ((3, 1.0, 1.0), (10, 1.0, 2.0), (5, 0.5, 3.0)):
        w = default_block_weights(d, R, B, gamma=True)
        assert sum(v * v for v in w.values()) == pytest.approx(1.0)
        assert w["yy"] ** 2 == pytest.approx(1.0 / (d + 1))

        def error(a_xx: float, a_xy: float, R: float = R, B: float = B) -> float:
            return (R * B / a_xy) ** 2 + (R * R / a_xx) ** 2 * (B / R) ** 2

        share = 1.0 - w["yy"] ** 2  # what xx and xy share
        grid = np.linspace(0.01, 0.99, 981) * share
        best = min(error(np.sqrt(s), np.sqrt(share - s)) for s in grid)
        assert error(w["xx"], w["xy"]) <= best * (1 + 1e-9)
        C = np.array([R * R, R * B, B * B])
        old = C / np.linalg.norm(C)  # bound-proportional
        if B != R:
            assert error(old[0], old[1]) > error(w["xx"] * np.sqrt((old[0] ** 2 + old[1] ** 2) / share),
                                                 w["xy"] * np.sqrt((old[0] ** 2 + old[1] ** 2) / share))
    model = LinearRegression(dim=4, dataset_size=10, noise="gamma")
    assert model.default_block_weights() == default_block_weights(4, gamma=True)
    assert set(LinearRegression(dim=4, dataset_size=10).default_block_weights()) == {"xx", "xy"}


def test_noise_aware_floor_is_the_public_spectral_edge_of_the_xx_noise():
    """With diagonal noise std s on the xx mean, the target precision is prior + N proj(xx)
    with proj raising eigenvalues to floor_factor sqrt(d) s (default sqrt(2): the Wigner edge);
    eigenvalues above the floor, and the eigenvectors, are kept exactly."""
    d, N, s = 4, 50, 0.01
    m = LinearRegression(d, N, noise="gamma")
    m.set_noise_scale({"xx": s, "xy": 0.0, "yy": 0.0})
    assert m.eigen_floor == pytest.approx(math.sqrt(2.0) * math.sqrt(d) * s, rel=1e-15)
    Q = np.linalg.qr(np.random.default_rng(3).normal(size=(d, d)))[0]
    lam = np.array([-0.05, 0.001, 0.2, 0.5])  # two below the floor 0.04, two above
    xx = (Q * lam) @ Q.T
    m.update({"xx": xx, "xy": np.zeros(d), "yy": np.array(0.1)}, 1.0)
    got = np.linalg.eigvalsh(m.state()["precision"])
    want = np.sort(1.0 + N * np.maximum(lam, m.eigen_floor))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # the Wigner edge: the spectral norm of the engine's symmetric noise is close to sqrt(2 d) s for large d
    from stream_vips.privacy.mechanisms import symmetric_noise

    big = 400
    norm = np.linalg.norm(symmetric_noise(np.random.default_rng(0), big, 1.0), 2)
    assert abs(norm / math.sqrt(2 * big) - 1.0) < 0.05  # edge fluctuations are O(d^-2/3)


def test_floor_keeps_a_private_fit_below_the_mean_predictor_where_the_old_rule_blew_up():
    """Small N, noisy xx: without a noise-aware floor (factor ~0) the mean explodes in a
    noise-swamped direction; the default floor keeps the error bounded (same noise draw)."""
    from stream_vips.fitting import fit

    rng = np.random.default_rng(11)
    n, d = 300, 6
    X = np.hstack([rng.uniform(-0.3, 0.3, (n, d - 1)), np.full((n, 1), 0.5)])
    y = np.clip(X @ rng.normal(size=d) + 0.1 * rng.normal(size=n), -1, 1)
    def rmse(**kw):
        res = fit((X, y), "linreg", 1.0, 1e-5, seed=4, noise="gamma", **kw)
        return float(np.sqrt(np.mean((res.posterior.model.predictive(X)[0] - y) ** 2)))
    mean_rmse = float(np.std(y))
    assert rmse() < mean_rmse * 1.5
    assert rmse(floor_factor=1e-12) > 3 * rmse()
