"""DP-SEP mixture of Gaussians: moment matching against quadrature, clustering, read side."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from scipy.stats import norm

from stream_vips.models.sep.core import SITE
from stream_vips.models.sep.mixture import MixtureSEP


def _assert_tilted_moments(model: MixtureSEP, x: np.ndarray, weights: np.ndarray, sds: np.ndarray,
                           rel: float) -> None:
    """The projected marginals of cavity + site match the tilted density over (mu1, mu2), integrated
    on a tensor Gauss-Hermite grid of the cavity (J = 2 components in 1-d)."""
    eta_c, prec_c = model.cavity()
    eta_s, prec_s = model.local_sites({"x": x})
    post_prec = prec_c[:, 0, 0] + prec_s[0, :, 0, 0]
    post_mean = (eta_c[:, 0] + eta_s[0, :, 0]) / post_prec
    cm, cv = eta_c[:, 0] / prec_c[:, 0, 0], 1 / prec_c[:, 0, 0]
    u, gw = np.polynomial.hermite_e.hermegauss(120)
    m1 = cm[0] + np.sqrt(cv[0]) * u[:, None]
    m2 = cm[1] + np.sqrt(cv[1]) * u[None, :]
    lik = weights[0] * norm.pdf(x[0, 0], m1, sds[0]) + weights[1] * norm.pdf(x[0, 0], m2, sds[1])
    W = np.outer(gw, gw) * lik
    Z = W.sum()
    for mu, j in ((m1 * np.ones_like(m2), 0), (m2 * np.ones_like(m1), 1)):
        mean = (W * mu).sum() / Z
        var = (W * (mu - mean) ** 2).sum() / Z
        assert post_mean[j] == pytest.approx(mean, rel=rel, abs=1e-12)
        assert 1 / post_prec[j] == pytest.approx(var, rel=10 * rel)


def test_local_site_gives_the_moments_of_the_tilted_distribution():
    sd = 0.7
    model = MixtureSEP(n_components=2, dim=1, dataset_size=5, clip=None, noise_sd=sd, prior_var=2.0,
                       learn_spreads=False)
    model.load_state({"eta": np.array([[-1.0], [1.5]]), "prec": np.array([[[3.0]], [[2.0]]])})
    _assert_tilted_moments(model, np.array([[0.4]]), np.array([0.5, 0.5]), np.array([sd, sd]), rel=1e-9)


def test_responsibilities_are_the_posterior_predictive_weights():
    model = MixtureSEP(n_components=3, dim=2, dataset_size=10, clip=None, noise_sd=0.5, init_seed=2)
    X = np.random.default_rng(0).normal(size=(7, 2))
    r = model.responsibilities(X)
    means, covs = model.posterior()
    from scipy.stats import multivariate_normal as mvn

    dens = np.stack([mvn(means[j], covs[j] + 0.25 * np.eye(2)).pdf(X) for j in range(3)], 1)
    np.testing.assert_allclose(r, dens / dens.sum(1, keepdims=True), rtol=1e-10)
    assert model.predict(X).tolist() == dens.argmax(1).tolist()


def test_non_private_sep_recovers_well_separated_cluster_means():
    rng = np.random.default_rng(3)
    J, d, N = 3, 2, 600
    true = np.array([[-3.0, 0.0], [3.0, 0.0], [0.0, 4.0]])
    h = rng.integers(0, J, N)
    X = true[h] + 0.5 * rng.normal(size=(N, d))
    model = MixtureSEP(n_components=J, dim=d, dataset_size=N, clip=None, noise_sd=0.5, prior_var=10.0, init_seed=1,
                       learn_spreads=False)
    for t in range(80):
        idx = rng.choice(N, 100, replace=False)
        model.update({SITE: model.clipped_sum({"x": X[idx]})[SITE] / 100}, (2.0 + t) ** -0.7)
    means, covs = model.posterior()
    row, col = linear_sum_assignment(((means[:, None] - true[None]) ** 2).sum(-1))
    # Posterior sd of a cluster mean is about 0.5 / sqrt(200) = 0.035; allow stochastic-average error.
    assert np.max(np.abs(means[row] - true[col])) < 0.15
    np.testing.assert_allclose(np.diagonal(covs, axis1=1, axis2=2), 0.25 / (N / J), rtol=0.3)
    component_of_true = np.empty(J, dtype=int)
    component_of_true[col] = row
    assert np.mean(model.predict(X) == component_of_true[h]) > 0.99


def test_initial_means_are_public_and_seeded():
    a = MixtureSEP(n_components=4, dim=3, dataset_size=100, clip=1.0, init_seed=5)
    b = MixtureSEP(n_components=4, dim=3, dataset_size=100, clip=1.0, init_seed=5)
    c = MixtureSEP(n_components=4, dim=3, dataset_size=100, clip=1.0, init_seed=6)
    np.testing.assert_array_equal(a.site, b.site)
    assert not np.allclose(a.posterior()[0], c.posterior()[0])
    assert a.hyperparameters()["init_seed"] == 5
    with pytest.raises(ValueError, match="init_seed"):
        MixtureSEP(n_components=2, dim=1, dataset_size=10, clip=1.0, init_seed=-1)


# -- learnt spreads: the statistics, their bounds, the update ------------------------------------

from stream_vips.core.engine import allocation_weights  # noqa: E402
from stream_vips.models.sep.mixture import COUNT, NOISE_SHRINK, SQUARE, STAT_NOISE  # noqa: E402


def _spread_model(**kw):
    params = {"n_components": 3, "dim": 2, "dataset_size": 50, "clip": 1.0, "spread_bound": 1.5, "init_seed": 3}
    return MixtureSEP(**(params | kw))


@pytest.mark.parametrize("spreads", ["diag", "spherical"])
def test_the_statistics_are_the_responsibility_weighted_counts_and_clipped_squares(spreads):
    model = _spread_model(spreads=spreads)
    X = np.array([[0.3, -0.2], [5.0, -7.0], [-1.0, 1.0]])
    eta_c, prec_c = model.cavity()
    C = np.linalg.inv(prec_c)
    c = np.einsum("jde,je->jd", C, eta_c)
    w, v = model.weights(), model.variances()
    from scipy.stats import multivariate_normal as mvn

    dens = np.stack([w[j] * mvn(c[j], C[j] + np.diag(v[j])).pdf(X) for j in range(3)], 1)
    r = dens / dens.sum(1, keepdims=True)
    sq = r[..., None] * np.minimum((X[:, None, :] - c[None]) ** 2, 1.5**2)
    if spreads == "spherical":  # the mean square over the coordinates
        sq = sq.mean(axis=2)
    sums = model.clipped_sum({"x": X})
    np.testing.assert_allclose(sums[COUNT], r.sum(0), rtol=1e-10)
    np.testing.assert_allclose(sums[SQUARE], sq.sum(0), rtol=1e-10)
    assert sums[COUNT].sum() == pytest.approx(3.0)


@pytest.mark.parametrize("spreads, factor", [("diag", np.sqrt(3)), ("spherical", 1.0)])
def test_no_record_exceeds_the_claimed_bounds_and_the_far_ones_reach_them(spreads, factor):
    model = _spread_model(dim=3, spread_bound=0.7, spreads=spreads)
    rng = np.random.default_rng(11)
    adversarial = np.array([[1e5, -1e5, 1e5], [0.0, 0.0, 0.0], [1e-300, 0, 0], [-3e5, 2.0, 0.5], [0.7, 0.7, 0.7]])
    X = np.vstack([adversarial, 50.0 * rng.standard_cauchy((200, 3))])
    bound_q = factor * 0.7**2  # sqrt(d) b^2 per coordinate, b^2 for one spread per component
    assert model.square_bound == pytest.approx(bound_q)
    blocks = {b.name: b.bound for b in model.blocks()}
    assert blocks == {"site": 1.0, COUNT: 1.0, SQUARE: pytest.approx(bound_q)}
    per_record = [model.clipped_sum({"x": x[None]}) for x in X]
    for rec in per_record:
        assert np.linalg.norm(rec[COUNT]) <= 1.0 + 1e-12 and np.all(rec[COUNT] >= 0)
        assert np.linalg.norm(rec[SQUARE]) <= bound_q * (1 + 1e-12) and np.all(rec[SQUARE] >= 0)
        assert np.linalg.norm(rec["site"]) <= 1.0 + 1e-12
    # A far record falls in one component (r one-hot) with every residual beyond b: both bounds are reached.
    far = per_record[0]
    assert np.linalg.norm(far[COUNT]) == pytest.approx(1.0, abs=1e-9)
    assert np.linalg.norm(far[SQUARE]) == pytest.approx(bound_q, rel=1e-9)


@pytest.mark.parametrize("spreads", ["diag", "spherical"])
def test_the_diameter_is_the_closed_form_and_bounds_every_neighbouring_pair(spreads):
    model = _spread_model(spread_share=0.3, spreads=spreads)
    weights = allocation_weights(model.blocks(), model.default_block_weights())
    assert weights["site"] ** 2 == pytest.approx(0.7) and weights[COUNT] ** 2 == pytest.approx(0.15)
    diameter = model.diameter(weights)
    assert diameter == pytest.approx(np.sqrt(4 * 0.7 + 2 * 0.3))
    assert model.diameter(None) == 2.0 and _spread_model(learn_spreads=False).diameter(weights) == 2.0
    bounds = {b.name: b.bound for b in model.blocks()}
    rng = np.random.default_rng(5)
    X = np.vstack([rng.normal(scale=3.0, size=(300, 2)), [[1e6, 1e6], [-1e6, -1e6], [1e6, -1e6]]])
    contrib = [model.clipped_sum({"x": x[None]}) for x in X]
    scaled = np.array([np.concatenate([np.ravel(c[k]) * weights[k] / bounds[k] for k in bounds]) for c in contrib])
    gaps = np.linalg.norm(scaled[:, None] - scaled[None], axis=-1)
    assert gaps.max() <= diameter * (1 + 1e-12)
    # Not loose by much: no pair reaches every block's worst case at once (sites share their precision part).
    assert gaps.max() > 0.85 * diameter


def test_the_update_averages_the_statistics_and_shrinks_them_with_the_noise_level():
    model = _spread_model(dataset_size=100, prior_count=4.0, noise_sd=0.5, sd_floor=0.01, spread_damping=1.5)
    count0, square0 = model.state()[COUNT], model.state()[SQUARE]
    assert model.variances() == pytest.approx(np.full((3, 2), 0.25))  # the prior's spreads exactly
    assert model.weights() == pytest.approx(np.full(3, 1 / 3))
    m_count, m_square = np.array([0.5, 0.3, 0.2]), np.array([[0.02, 0.08], [0.05, 0.05], [0.3, 0.01]])
    site = model.clipped_sum({"x": np.zeros((0, 2))})["site"]
    model.set_noise_scale({"site": 0.0, COUNT: 0.4, SQUARE: 0.2})
    model.update({"site": site, COUNT: m_count, SQUARE: m_square}, 0.25)  # s = 0.25, u = 1.5 s
    u = 0.375
    count = (1 - u) * count0 + u * m_count
    square = (1 - u) * square0 + u * m_square
    np.testing.assert_allclose(model.state()[COUNT], count, rtol=1e-12)
    np.testing.assert_allclose(model.state()[STAT_NOISE], [u * 0.4, u * 0.2], rtol=1e-12)
    nu_n, nu_q = NOISE_SHRINK * 100 * u * 0.4, NOISE_SHRINK * 100 * u * 0.2 / 0.25
    assert model.prior_counts() == pytest.approx((nu_n, nu_q)) and min(nu_n, nu_q) > 4.0  # the noise decides
    np.testing.assert_allclose(model.weights(), (100 * count + nu_n) / (100 * count + nu_n).sum(), rtol=1e-12)
    expected = np.clip((100 * square + nu_q * 0.25) / (100 * count + nu_q)[:, None], 0.01**2, 1.5**2)
    np.testing.assert_allclose(model.variances(), expected, rtol=1e-12)
    rebuilt = _spread_model(dataset_size=100, prior_count=4.0, noise_sd=0.5, sd_floor=0.01, spread_damping=1.5)
    rebuilt.load_state(model.state())
    np.testing.assert_allclose(rebuilt.variances(), model.variances(), rtol=1e-12)
    with pytest.raises(ValueError, match="count"):
        model.update({"site": site, COUNT: np.ones(2), SQUARE: m_square}, 0.5)


def test_a_state_without_statistics_is_the_known_sd_model():
    model = _spread_model(noise_sd=0.4)
    state = model.state()
    rebuilt = _spread_model(noise_sd=0.4)
    rebuilt.load_state({"eta": state["eta"], "prec": state["prec"]})
    np.testing.assert_allclose(rebuilt.variances(), 0.16, rtol=1e-12)
    old = _spread_model(noise_sd=0.4, learn_spreads=False)
    old.load_state({"eta": state["eta"], "prec": state["prec"]})
    X = np.random.default_rng(0).normal(size=(5, 2))
    np.testing.assert_allclose(rebuilt.responsibilities(X), old.responsibilities(X), rtol=1e-12)
    with pytest.raises(ValueError, match="stat_noise"):
        rebuilt.load_state({"eta": state["eta"], "prec": state["prec"], COUNT: state[COUNT], SQUARE: state[SQUARE]})


def test_the_site_with_diagonal_spreads_and_weights_gives_the_tilted_moments():
    # As the known-sd test, with Sigma_j = diag(v_j) and unequal weights set through the statistics.
    model = MixtureSEP(n_components=2, dim=1, dataset_size=5, clip=None, prior_var=2.0, prior_count=1.0, sd_floor=0.01)
    model.load_state({"eta": np.array([[-1.0], [1.5]]), "prec": np.array([[[3.0]], [[2.0]]]),
                      COUNT: np.array([0.7, 0.3]), SQUARE: np.array([[0.7 * 0.09], [0.3 * 1.2]]),
                      STAT_NOISE: np.zeros(2)})
    v, w = model.variances()[:, 0], model.weights()
    assert v[0] != pytest.approx(v[1]) and w[0] != pytest.approx(w[1])
    _assert_tilted_moments(model, np.array([[0.4]]), w, np.sqrt(v), rel=1e-8)


def test_bad_spread_settings_fail_naming_the_key():
    for key, value in (("spread_share", 1.0), ("spread_share", 0.0), ("spread_bound", -1.0), ("prior_count", 0.0),
                       ("sd_floor", -0.1), ("learn_spreads", "yes"), ("spread_damping", 0.0)):
        with pytest.raises(ValueError, match=key):
            _spread_model(**{key: value})


def test_a_seeded_private_fit_is_deterministic_and_learns_the_spreads():
    from stream_vips import fit

    rng = np.random.default_rng(21)
    centres, sds = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 3.0]]), np.array([[0.2, 0.6], [0.6, 0.2], [0.4, 0.4]])
    h = rng.integers(0, 3, 3000)
    X = centres[h] + sds[h] * rng.normal(size=(3000, 2))
    a = fit(X, "sep_mixture", 1.0, seed=3, steps=60, n_components=3)
    b = fit(X, "sep_mixture", 1.0, seed=3, steps=60, n_components=3)
    assert a.message["natural_parameters"] == b.message["natural_parameters"]
    model = fit(X, "sep_mixture", non_private=True, n_components=3, init_seed=2, prior_var=4.0).posterior.model
    means, sd = model.posterior()[0], np.sqrt(model.variances())
    row, col = linear_sum_assignment(((means[:, None] - centres[None]) ** 2).sum(-1))
    # ~1000 points per component: a sample sd's relative error is about 1 / sqrt(2 * 1000) = 0.022;
    # the damped average over the last ~100 batches of ~30 points adds about 1 / sqrt(2 * 3000 / 3)
    # and the prior's 10 pseudo-records at sd 0.5 move a variance by at most 1%: 15% is several sds.
    np.testing.assert_allclose(sd[row], sds[col], rtol=0.15)
    np.testing.assert_allclose(model.weights(), 1 / 3, atol=0.05)
    assert np.mean(model.predict(X) == row[np.argsort(col)][h]) > 0.97


def test_diagonal_factors_match_the_full_projection_mean_and_marginal_variances():
    # With a diagonal cavity the full projection's mean and the diagonal of its covariance are
    # the tilted distribution's mean and marginal variances: the diagonal family keeps exactly those.
    rng = np.random.default_rng(4)
    K, d = 3, 4
    state = {"eta": rng.normal(size=(K, d)), "prec": rng.uniform(0.5, 3.0, (K, d))[..., None] * np.eye(d),
             COUNT: np.array([0.5, 0.3, 0.2]), SQUARE: rng.uniform(0.05, 0.3, (K, d)), STAT_NOISE: np.zeros(2)}
    full, diag = (MixtureSEP(n_components=K, dim=d, dataset_size=50, clip=None, mean_covariance=c)
                  for c in ("full", "diag"))
    for model in (full, diag):
        model.load_state(state)
    X = rng.normal(size=(6, d))
    eta_c, prec_c = full.cavity()
    eta_s, prec_s = full.local_sites({"x": X})
    cov = np.linalg.inv(prec_c + prec_s)
    mean = np.einsum("bjde,bje->bjd", cov, eta_c + eta_s)
    eta_cd, prec_cd = diag.cavity()
    eta_sd, prec_sd = diag.local_sites({"x": X})
    np.testing.assert_allclose(1 / (prec_cd + prec_sd), np.diagonal(cov, axis1=-2, axis2=-1), rtol=1e-9)
    np.testing.assert_allclose((eta_cd + eta_sd) / (prec_cd + prec_sd), mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(diag.responsibilities(X), full.responsibilities(X), rtol=1e-10)
    assert diag.blocks()[0].shape == (K * 2 * d,) and full.blocks()[0].shape == (K * (d + d * (d + 1) // 2),)


def test_the_isotropic_site_keeps_the_tilted_mean_and_the_mean_of_its_marginal_variances():
    # EP onto N(m, sigma^2 I) matches E[mu] and E[||mu||^2]: the diagonal projection's mean, and
    # sigma^2 the mean of its marginal variances, from the same isotropic cavity.
    rng = np.random.default_rng(7)
    K, d = 3, 4
    lam = rng.uniform(0.5, 3.0, K)
    state = {"eta": rng.normal(size=(K, d)), "prec": lam[:, None, None] * np.eye(d)}
    diag, sph = (MixtureSEP(n_components=K, dim=d, dataset_size=50, clip=None, mean_covariance=c,
                            learn_spreads=False) for c in ("diag", "spherical"))
    for model in (diag, sph):
        model.load_state(state)
    X = rng.normal(size=(6, d))
    eta_cd, prec_cd = diag.cavity()
    eta_sd, prec_sd = diag.local_sites({"x": X})
    eta_cs, prec_cs = sph.cavity()
    eta_ss, prec_ss = sph.local_sites({"x": X})
    assert prec_ss.shape == (6, K, 1) and eta_ss.shape == (6, K, d)
    var_d = 1 / (prec_cd + prec_sd)
    np.testing.assert_allclose(1 / (prec_cs + prec_ss), var_d.mean(axis=-1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose((eta_cs + eta_ss) / (prec_cs + prec_ss), (eta_cd + eta_sd) * var_d, rtol=1e-9,
                               atol=1e-12)
    np.testing.assert_allclose(sph.responsibilities(X), diag.responsibilities(X), rtol=1e-10)
    assert sph.blocks()[0].shape == (K * (d + 1),)
    assert sph.hyperparameters()["mean_covariance"] == "spherical"


def test_an_isotropic_model_round_trips_its_state_and_refuses_a_diagonal_one():
    model = MixtureSEP(n_components=2, dim=3, dataset_size=20, clip=1.0, mean_covariance="spherical", init_seed=4,
                       learn_spreads=False)
    again = MixtureSEP(n_components=2, dim=3, dataset_size=20, clip=1.0, mean_covariance="spherical",
                       learn_spreads=False)
    again.load_state(model.state())
    np.testing.assert_allclose(again.site, model.site, atol=1e-15)
    state = model.state()
    state["prec"] = state["prec"] * np.array([1.0, 1.0, 1.5])
    with pytest.raises(ValueError, match="isotropic"):
        again.load_state(state)


def test_a_diagonal_model_round_trips_its_state_and_refuses_a_full_one():
    model = MixtureSEP(n_components=2, dim=3, dataset_size=20, clip=1.0, mean_covariance="diag", init_seed=4)
    again = MixtureSEP(n_components=2, dim=3, dataset_size=20, clip=1.0, mean_covariance="diag")
    again.load_state(model.state())
    np.testing.assert_allclose(again.site, model.site, atol=1e-15)
    assert model.hyperparameters()["mean_covariance"] == "diag"
    state = model.state()
    state["prec"] = state["prec"] + 0.1 * (1 - np.eye(3))
    with pytest.raises(ValueError, match="diagonal"):
        again.load_state(state)
    with pytest.raises(ValueError, match="mean_covariance"):
        MixtureSEP(n_components=2, dim=3, dataset_size=20, mean_covariance="round")


def test_the_fit_rule_takes_isotropic_factors_and_known_spreads_from_eight_features():
    from stream_vips.models.sep.mixture import RULE_MANY_DIMENSIONS

    assert RULE_MANY_DIMENSIONS == 8
    few = MixtureSEP.fit_rule(3000, 7, 1.0, 1e-5, False).model_params
    many = MixtureSEP.fit_rule(3000, 8, 1.0, 1e-5, False)
    assert "mean_covariance" not in few and "learn_spreads" not in few
    assert many.model_params["mean_covariance"] == "spherical" and many.model_params["learn_spreads"] is False
    assert "sep_mixture_covariance" in many.why["mean_covariance"]
    model = MixtureSEP(**{**many.model_params, "dataset_size": 3000})
    assert model.factor == "spherical" and not model.learn_spreads and model.blocks()[0].shape == (3 * 9,)


def test_a_spherical_model_learns_one_spread_per_component():
    model = _spread_model(spreads="spherical", dataset_size=100, prior_count=4.0, noise_sd=0.5)
    assert model.state()[SQUARE].shape == (3,)
    assert MixtureSEP.state_shapes(model.hyperparameters())[SQUARE] == (3,)
    sums = model.clipped_sum({"x": np.random.default_rng(2).normal(size=(40, 2))})
    model.update({k: v / 40 for k, v in sums.items()}, 0.5)
    v = model.variances()
    assert v.shape == (3, 2) and np.all(v[:, 0] == v[:, 1]) and not np.allclose(v, 0.25)
    assert "spherical spreads learnt" in model.summary()["notes"][0]
    assert "diagonal spreads learnt" in _spread_model().summary()["notes"][0]
    with pytest.raises(ValueError, match="spreads"):
        _spread_model(spreads="full")
