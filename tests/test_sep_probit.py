"""DP-SEP probit: closed-form moment matching against numerical integration, records, prediction."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

from stream_vips.models.sep.core import SITE, pack
from stream_vips.models.sep.probit import ProbitSEP, site_coefficients, tilted_moments


def quad_moments(mu, s2, t):
    sd = np.sqrt(s2)
    f = lambda a, k: a**k * norm.pdf(a, mu, sd) * norm.cdf(t * a)  # noqa: E731
    lo, hi = mu - 12 * sd, mu + 12 * sd
    Z = integrate.quad(f, lo, hi, args=(0,), epsabs=0, epsrel=1e-11, limit=200)[0]
    m1 = integrate.quad(f, lo, hi, args=(1,), epsabs=0, epsrel=1e-11, limit=200)[0] / Z
    m2 = integrate.quad(f, lo, hi, args=(2,), epsabs=0, epsrel=1e-11, limit=200)[0] / Z
    return Z, m1, m2 - m1**2


CASES = [(0.0, 1.0, 1), (1.3, 0.4, -1), (-2.0, 3.0, 1), (0.5, 0.01, 1), (4.0, 2.0, -1), (-3.0, 0.5, 1)]


@pytest.mark.parametrize("mu, s2, t", CASES)
def test_tilted_moments_match_numerical_integration(mu, s2, t):
    Z, m, v = tilted_moments(mu, s2, t)
    Zq, mq, vq = quad_moments(mu, s2, t)
    assert Z == pytest.approx(Zq, rel=1e-8)
    assert m == pytest.approx(mq, rel=1e-7, abs=1e-9)
    assert v == pytest.approx(vq, rel=1e-6)


@pytest.mark.parametrize("mu, s2, t", CASES)
def test_site_times_cavity_is_the_projected_tilted(mu, s2, t):
    nu, tau = site_coefficients(mu, s2, t)
    _, m, v = tilted_moments(mu, s2, t)
    assert tau >= 0
    assert 1 / s2 + tau == pytest.approx(1 / v, rel=1e-10)
    assert mu / s2 + nu == pytest.approx(m / v, rel=1e-9, abs=1e-12)


def test_site_is_stable_far_in_the_tail():
    # z = -40: Phi(z) underflows a naive ratio; the log-space ratio stays finite and tau <= 1/s2.
    nu, tau = site_coefficients(np.array([-40.0 * np.sqrt(2.0)]), np.array([1.0]), np.array([1.0]))
    assert np.all(np.isfinite([nu, tau])) and 0 < tau[0] < 1.0


def test_multivariate_site_matches_two_dimensional_integration():
    # Tensor Gauss-Hermite quadrature over the whitened cavity N(m, V): exact up to ~1e-12 for
    # the smooth integrand Phi(t x^T w) times polynomials of degree <= 2.
    model = ProbitSEP(dim=2, dataset_size=10, clip=None, intercept=False)
    model.load_state({"eta": np.array([[0.7, -0.4]]), "prec": np.array([[[2.0, 0.6], [0.6, 1.5]]])})
    x, y = np.array([1.2, -0.8]), 0
    eta_c, prec_c = model.cavity()
    eta_s, prec_s = model.local_sites({"x": x[None], "y": np.array([y])})
    P = prec_c[0] + prec_s[0, 0]
    mean, cov = np.linalg.solve(P, eta_c[0] + eta_s[0, 0]), np.linalg.inv(P)

    V = np.linalg.inv(prec_c[0])
    m = V @ eta_c[0]
    u, wts = np.polynomial.hermite_e.hermegauss(80)
    U = np.stack(np.meshgrid(u, u, indexing="ij"), -1).reshape(-1, 2)
    pts = m + U @ np.linalg.cholesky(V).T
    W = np.outer(wts, wts).ravel() * norm.cdf(-(pts @ x))  # y = 0: t = -1
    Z = W.sum()
    m1 = W @ pts / Z
    c = (W[:, None, None] * (pts - m1)[:, :, None] * (pts - m1)[:, None, :]).sum(0) / Z
    np.testing.assert_allclose(mean, m1, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(cov, c, rtol=1e-8, atol=1e-11)


def test_rank_one_clipped_sum_equals_dense_clipped_sites():
    model = ProbitSEP(dim=4, dataset_size=50, clip=2.2, intercept=True)
    rng = np.random.default_rng(1)
    batch = model.parse_batch([{"x": rng.normal(0, 2, 4).tolist(), "y": int(rng.integers(2))} for _ in range(30)]).rows
    eta, prec = model.local_sites(batch)
    dense = pack(eta, prec)
    norms = np.linalg.norm(dense, axis=1)
    clipped = dense * np.minimum(1, 2.2 / norms)[:, None]
    np.testing.assert_allclose(model.clipped_sum(batch)[SITE], clipped.sum(0), rtol=1e-10, atol=1e-12)
    assert np.any(norms > 2.2) and np.any(norms < 2.2)


def test_parse_batch_labels_intercept_and_clipping():
    model = ProbitSEP(dim=2, dataset_size=10, clip=1.0, x_clip=5.0, intercept=True)
    parsed = model.parse_batch([
        {"x": [3.0, 4.0], "y": 1}, {"x": [30.0, 40.0], "y": 0}, {"x": [1.0, 1.0], "y": 2},
        {"x": [1.0, 1.0]}, {"x": [1.0, 1.0], "y": "1"}, {"x": [1.0, 1.0], "y": 0.5},
    ])
    assert parsed.accepted.tolist() == [0, 1]
    np.testing.assert_allclose(parsed.rows["x"], [[3.0, 4.0, 1.0], [3.0, 4.0, 1.0]])
    assert parsed.rows["y"].tolist() == [1, 0]
    assert [r[1] for r in parsed.rejected] == ["out_of_range", "missing_field", "wrong_type", "out_of_range"]
    assert model.row_layout()["x"][1] == (3,)


def test_non_private_sep_learns_a_probit_classifier():
    rng = np.random.default_rng(2)
    N, d = 2000, 3
    w_true = np.array([1.5, -1.0, 0.5, 0.3])  # last entry: intercept
    X = rng.normal(size=(N, d))
    p_true = norm.cdf(X @ w_true[:d] + w_true[d])
    y = (rng.random(N) < p_true).astype(int)
    model = ProbitSEP(dim=d, dataset_size=N, clip=None, prior_var=10.0, intercept=True)
    rows = model.parse_batch([{"x": X[i].tolist(), "y": int(y[i])} for i in range(N)]).rows
    for t in range(60):
        idx = rng.choice(N, 200, replace=False)
        model.update({SITE: model.clipped_sum({k: v[idx] for k, v in rows.items()})[SITE] / 200}, (1.0 + t) ** -0.7)
    mean, cov = model.posterior()
    sd = np.sqrt(np.diag(cov[0]))
    assert np.all(np.abs(mean[0] - w_true) < 5 * sd + 0.1), (mean[0], w_true, sd)
    assert np.mean(np.abs(model.predict_proba(X) - p_true)) < 0.05


def test_defaults_add_no_second_intercept_to_records_that_carry_their_bias_column():
    """Records of the logistic-style format carry their bias column: the defaults append nothing,
    so one constant column means exactly one intercept weight (fit, the learner, the rule)."""
    from stream_vips import PrivateLearner, fit
    from stream_vips.fitting import fit_settings

    model = ProbitSEP(dim=3, dataset_size=10)
    assert model.intercept is False and model.clip == 1.0
    rows = model.parse_batch([{"x": [0.3, -0.2, 1.0], "y": 1}]).rows
    np.testing.assert_allclose(rows["x"], [[0.3, -0.2, 1.0]])
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=(300, 2)) / 2, np.ones(300)])  # the last column: the bias
    y = (rng.random(300) < norm.cdf(X @ [1.0, -1.0, 0.5])).astype(int)
    posterior = fit((X, y), "sep_probit", seed=0, steps=3).posterior
    assert posterior.model.intercept is False and posterior.model.posterior()[0][0].shape == (3,)
    assert posterior.message["hyperparameters"]["dim"] == 3
    assert "intercept" not in fit_settings("sep_probit", 300, 3, 1.0, 1e-5).model_params  # the default applies
    with PrivateLearner("sep_probit", dim=3, reservoir=100, batch_size=20) as lrn:
        assert lrn.model.posterior()[0][0].shape == (3,)


def test_the_estimator_adds_exactly_one_intercept():
    """PrivateProbitClassifier's fit_intercept is the family's own intercept, passed explicitly: rows
    of X without a bias column get one constant, and the weights have d + 1 entries."""
    from stream_vips.estimators import PrivateProbitClassifier

    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 2))
    y = (X @ [1.0, -1.0] + 0.3 + rng.normal(size=400) > 0).astype(int)
    clf = PrivateProbitClassifier(epsilon=1.0, random_state=0, steps=3).fit(X, y)
    assert clf.model_.intercept is True and clf.model_.posterior()[0][0].shape == (3,)
    assert clf.n_features_in_ == 2
    plain = PrivateProbitClassifier(epsilon=1.0, random_state=0, steps=3, fit_intercept=False).fit(X, y)
    assert plain.model_.intercept is False and plain.model_.posterior()[0][0].shape == (2,)


def test_the_default_clip_leaves_a_typical_unit_scale_site_whole():
    """The numbers the clip's docstring states: at the prior's cavity (s2 = ||x||^2 = 1) a site's
    norm is 0.95 at x^T m = 0, 0.44 at t x^T m = 2 and 1.10 at -2."""
    for mu, want in ((0.0, 0.95), (2.0, 0.44), (-2.0, 1.10)):
        nu, tau = site_coefficients(np.array(mu), np.array(1.0), np.array(1.0))
        assert float(np.hypot(nu, tau)) == pytest.approx(want, abs=0.005)
