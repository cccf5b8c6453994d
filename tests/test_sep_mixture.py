"""DP-SEP mixture of Gaussians: moment matching against quadrature, clustering, read side."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from scipy.stats import norm

from stream_vips.models.sep.core import SITE
from stream_vips.models.sep.mixture import MixtureSEP


def test_local_site_gives_the_moments_of_the_tilted_distribution():
    # J = 2 components in 1-d: the tilted density over (mu1, mu2) is integrated on a tensor
    # Gauss-Hermite grid of the cavity; the projected marginals must match cavity + site.
    sd = 0.7
    model = MixtureSEP(n_components=2, dim=1, dataset_size=5, clip=None, noise_sd=sd, prior_var=2.0,
                       learn_spreads=False)
    model.load_state({"eta": np.array([[-1.0], [1.5]]), "prec": np.array([[[3.0]], [[2.0]]])})
    x = np.array([[0.4]])
    eta_c, prec_c = model.cavity()
    eta_s, prec_s = model.local_sites({"x": x})
    post_prec = prec_c[:, 0, 0] + prec_s[0, :, 0, 0]
    post_mean = (eta_c[:, 0] + eta_s[0, :, 0]) / post_prec

    cm, cv = eta_c[:, 0] / prec_c[:, 0, 0], 1 / prec_c[:, 0, 0]
    u, w = np.polynomial.hermite_e.hermegauss(120)
    m1 = cm[0] + np.sqrt(cv[0]) * u[:, None]
    m2 = cm[1] + np.sqrt(cv[1]) * u[None, :]
    lik = 0.5 * norm.pdf(x[0, 0], m1, sd) + 0.5 * norm.pdf(x[0, 0], m2, sd)
    W = np.outer(w, w) * lik
    Z = W.sum()
    for mu, j in ((m1 * np.ones_like(m2), 0), (m2 * np.ones_like(m1), 1)):
        mean = (W * mu).sum() / Z
        var = (W * (mu - mean) ** 2).sum() / Z
        assert post_mean[j] == pytest.approx(mean, rel=1e-9, abs=1e-12)
        assert 1 / post_prec[j] == pytest.approx(var, rel=1e-8)


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
