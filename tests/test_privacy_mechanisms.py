"""Mechanisms: clipping, noise conventions (privacy rules 2, 6, 9 in docs/privacy.md), Analyze-Gauss,
PD projection."""

from __future__ import annotations

import numpy as np
import pytest

from stream_vips.privacy.mechanisms import (
    block_noise_stds,
    clip_factors,
    clip_rows,
    effective_noise_multiplier,
    gaussian_noise,
    make_rng,
    noise_std,
    project_pd,
    symmetric_noise,
)


def test_clip_rows_bounds_norms_and_keeps_short_rows():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 7)) * rng.uniform(0, 3, size=(500, 1))
    Y = clip_rows(X, 1.5)
    norms_x, norms_y = np.linalg.norm(X, axis=1), np.linalg.norm(Y, axis=1)
    assert np.all(norms_y <= 1.5 + 1e-12)
    short = norms_x <= 1.5
    assert short.any() and (~short).any()
    np.testing.assert_array_equal(Y[short], X[short])
    np.testing.assert_allclose(norms_y[~short], 1.5)
    # direction is kept
    np.testing.assert_allclose(Y[~short] / norms_y[~short, None], X[~short] / norms_x[~short, None])


def test_clip_factors_from_norms_and_zero_rows():
    np.testing.assert_allclose(clip_factors(np.array([0.0, 0.5, 2.0, 8.0]), 2.0), [1.0, 1.0, 1.0, 0.25])
    with pytest.raises(ValueError, match="bound"):
        clip_factors(np.ones(2), 0.0)
    with pytest.raises(ValueError, match="norms"):
        clip_factors(np.array([-1.0]), 1.0)


def test_noise_std_of_a_mean_is_z_C_over_S_and_paper_sigma_is_z_over_2():
    """Rules 2-3: a mean of S vectors clipped to C gets noise std z*C/S, and since replacing one
    record moves the mean by at most 2C/S the paper's sigma (std / sensitivity) is z/2."""
    z, C, S, d = 1.7, 0.8, 50, 3
    rng = np.random.default_rng(2)
    X = clip_rows(rng.normal(size=(S, d)) * 5, C)
    std = noise_std(z, C) / S
    assert std == pytest.approx(z * C / S)
    # worst-case replace-one neighbour: one row swapped for its antipode
    X2 = X.copy()
    X2[0] = -X[0]
    sensitivity = np.linalg.norm(X.mean(0) - X2.mean(0))
    assert sensitivity == pytest.approx(2 * C / S)
    assert std / sensitivity == pytest.approx(z / 2)
    # the draw has that std: chi-square bound on 20000 draws, 5 sigma of the sample-variance error
    draws = gaussian_noise(rng, (20000, d), std)
    assert abs(draws.var() / std**2 - 1) < 5 * np.sqrt(2 / draws.size)


def test_block_stds_are_one_mechanism_with_noise_multiplier_z():
    bounds = [1.0, 3.0, 0.5]
    stds = block_noise_stds(2.0, bounds)
    np.testing.assert_allclose(stds, 2.0 * np.linalg.norm(bounds))
    assert effective_noise_multiplier(bounds, stds) == pytest.approx(2.0)
    w = np.array([0.6, 0.8, 0.0001])
    w = w / np.linalg.norm(w)
    assert effective_noise_multiplier(bounds, block_noise_stds(2.0, bounds, w)) == pytest.approx(2.0)
    # Never the noise of one block alone: two blocks each noised at z*C_k are jointly z/sqrt(2).
    assert effective_noise_multiplier([1.0, 1.0], [2.0, 2.0]) == pytest.approx(2.0 / np.sqrt(2))
    with pytest.raises(ValueError, match="weights"):
        block_noise_stds(1.0, bounds, [1.0, 1.0, 1.0])


def test_symmetric_noise_variances_and_symmetry():
    rng, _ = make_rng(3)
    d, std, n = 4, 2.0, 20000
    E = np.stack([symmetric_noise(rng, d, std) for _ in range(n)])
    np.testing.assert_array_equal(E, np.swapaxes(E, 1, 2))
    var = E.var(axis=0)
    tol = 5 * np.sqrt(2 / n)  # relative sd of a sample variance is sqrt(2/n)
    assert np.all(np.abs(np.diag(var) / std**2 - 1) < tol)
    off = var[np.triu_indices(d, 1)]
    assert np.all(np.abs(off / (std**2 / 2) - 1) < tol)
    # distinct upper-triangle entries are independent
    assert abs(np.corrcoef(E[:, 0, 1], E[:, 0, 2])[0, 1]) < 5 / np.sqrt(n)


def test_analyze_gauss_map_preserves_the_frobenius_bound():
    """v(A) = (diag, sqrt(2) * upper) is an isometry from (sym, Frobenius) to (R^k, L2), so a
    record with ||A||_F <= C has ||v(A)|| <= C and noise std s on v is noise multiplier s/C."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=6)
    A = np.outer(x, x)
    iu = np.triu_indices(6, 1)
    v = np.concatenate([np.diag(A), np.sqrt(2) * A[iu]])
    assert np.linalg.norm(v) == pytest.approx(np.linalg.norm(A, "fro"))
    assert np.linalg.norm(A, "fro") == pytest.approx(x @ x)


def test_project_pd_floors_eigenvalues_and_keeps_pd_matrices():
    rng = np.random.default_rng(5)
    B = rng.normal(size=(5, 5))
    S = (B + B.T) / 2
    P = project_pd(S, 0.1)
    np.testing.assert_allclose(P, P.T)
    w = np.linalg.eigvalsh(P)
    assert w.min() >= 0.1 - 1e-10
    w_s = np.linalg.eigvalsh(S)
    np.testing.assert_allclose(np.sort(w), np.sort(np.maximum(w_s, 0.1)), atol=1e-10)
    Q = B @ B.T + np.eye(5)
    np.testing.assert_allclose(project_pd(Q, 0.5), Q, atol=1e-10)
    with pytest.raises(ValueError, match="floor"):
        project_pd(S, 0.0)
    with pytest.raises(ValueError, match="square"):
        project_pd(np.ones((2, 3)), 1.0)


def test_make_rng_seeded_flag_and_os_entropy():
    (a, sa), (b, sb) = make_rng(7), make_rng(7)
    assert sa and sb and a.normal() == b.normal()
    (c, sc), (d, sd) = make_rng(None), make_rng(None)
    assert not sc and not sd
    assert not np.array_equal(c.normal(size=4), d.normal(size=4))
    with pytest.raises(ValueError, match="seed"):
        make_rng(-1)


def test_block_noise_stds_validates_bounds_and_weights_and_allows_one_block():
    assert block_noise_stds(2.0, [1.5]).tolist() == [3.0]
    for bounds in ([], [1.0, 0.0], [1.0, -1.0], [[1.0, 2.0]]):
        with pytest.raises(ValueError, match="bounds"):
            block_noise_stds(1.0, bounds)
    for weights in ([1.0], [1.0, 0.0], [-0.6, 0.8], [0.5, 0.5]):
        with pytest.raises(ValueError, match="weights"):
            block_noise_stds(1.0, [1.0, 2.0], weights)


def test_noise_and_seed_arguments_are_checked_at_their_boundaries():
    """z and C must be > 0, a std >= 0 and finite (0: no noise), a seed a non-negative integer,
    Analyze-Gauss at least 1 x 1; each refused value is one step outside what is allowed."""
    assert effective_noise_multiplier([1.0], [0.5]) == 0.5  # z = s / C, an s below 1 included
    for bounds, stds in (([1.0, 1.0], [1.0]), ([0.0], [1.0]), ([1.0], [0.0]), ([-1.0], [1.0]), ([1.0], [-1.0])):
        with pytest.raises(ValueError, match="positive"):
            effective_noise_multiplier(bounds, stds)
    assert noise_std(0.5, 0.5) == 0.25
    for z, bound in ((0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)):
        with pytest.raises(ValueError, match="must be > 0"):
            noise_std(z, bound)
    rng = np.random.default_rng(0)
    assert gaussian_noise(rng, 3, 0.0).tolist() == [0.0, 0.0, 0.0]
    for std in (-1.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="std"):
            gaussian_noise(rng, 3, std)
    assert make_rng(0)[1] is True and make_rng(None)[1] is False
    for seed in (-1, True, 2.5):
        with pytest.raises(ValueError, match="seed"):
            make_rng(seed)
    assert symmetric_noise(rng, 1, 2.0).shape == (1, 1)
    for d in (0, True, 2.0):
        with pytest.raises(ValueError, match="positive integer"):
            symmetric_noise(rng, d, 1.0)
