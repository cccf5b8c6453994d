"""VIPS Pólya-Gamma logistic regression: E-step, M-step, sensitivities, engine integration."""

from __future__ import annotations

import cmath
import math
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from scipy.optimize import minimize

from stream_vips import messages
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import FixedSizeSampler, PoissonSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.logistic import (
    BayesianLogisticRegression,
    joint_diameter,
    log_loss,
    pg_mean,
    roc_auc,
)
from stream_vips.privacy.accountants import PldAccountant, RdpAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.ledger import MemoryLedger

C1, C2 = 0.5, 0.25


def synthetic(rng, n, d, scale=2.0):
    """Non-separable data: Gaussian inputs with a bias feature, labels drawn from the logistic
    model itself (so both labels occur on every region of input space), rows of norm <= 1."""
    X = rng.normal(size=(n, d)) / math.sqrt(d)
    X[:, -1] = 0.5
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    w = scale * rng.normal(size=d)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-X @ w))).astype(float)
    return X, y


def batch_vb(X, y, a0, b0, iters=5000, tol=1e-14):
    """Batch mean-field VB for PG-augmented logistic regression, written record by record.

    q(omega_n) = PG(1, c_n), c_n^2 = x_n^T (Sigma + mu mu^T) x_n; q(m) = N(mu, Sigma) with
    Sigma^-1 = sum_n E[omega_n] x_n x_n^T + E[alpha] I, Sigma^-1 mu = sum_n (y_n - 1/2) x_n;
    q(alpha) = Gamma(a0 + d/2, b0 + (mu^T mu + tr Sigma)/2).
    """
    n, d = X.shape
    alpha = a0 / b0
    mu, Sigma = np.zeros(d), np.eye(d) / alpha
    for _ in range(iters):
        M = Sigma + np.outer(mu, mu)
        P = alpha * np.eye(d)
        h = np.zeros(d)
        for i in range(n):
            c = math.sqrt(max(float(X[i] @ M @ X[i]), 0.0))
            omega = 0.25 if c == 0.0 else math.tanh(c / 2.0) / (2.0 * c)
            P += omega * np.outer(X[i], X[i])
            h += (y[i] - 0.5) * X[i]
        Sigma_new = np.linalg.inv(P)
        mu_new = Sigma_new @ h
        alpha = (a0 + d / 2.0) / (b0 + 0.5 * (mu_new @ mu_new + np.trace(Sigma_new)))
        done = np.max(np.abs(mu_new - mu)) < tol and np.max(np.abs(Sigma_new - Sigma)) < tol
        mu, Sigma = mu_new, Sigma_new
        if done:
            break
    return mu, Sigma, alpha


def full_batch_mean(model, X, y):
    """Noise-free means with the whole data set as batch (normaliser = N = n)."""
    return {k: v / len(y) for k, v in model.clipped_sum({"x": X, "y": y}).items()}


def set_second_moment(model, M, mu=None):
    """Give the model a posterior with E[m m^T] = M (mean ``mu``, default 0), through the
    documented state: precision P = N proj(S / N) + A I with S = P - A I, A tiny, no noise."""
    d = M.shape[0]
    mu = np.zeros(d) if mu is None else mu
    P = np.linalg.inv(M - np.outer(mu, mu))
    P = (P + P.T) / 2
    A = 1e-30
    model.load_state({"h": P @ mu, "precision": P, "s2_blend": P - A * np.eye(d),
                      "alpha": np.array([1.0, 1.0, A]), "noise_var": np.array([0.0])})


def scaled_difference(model, rec_a, rec_b, weights):
    """||(w_k (S_k(a) - S_k(b)))_k|| for one-record batches: the engine's joint sensitivity."""
    sa = model.clipped_sum({"x": rec_a[0][None, :], "y": np.array([rec_a[1]])})
    sb = model.clipped_sum({"x": rec_b[0][None, :], "y": np.array([rec_b[1]])})
    w1, w2 = weights[0] / C1, weights[1] / C2
    return math.sqrt(w1**2 * np.sum((sa["s1"] - sb["s1"]) ** 2) + w2**2 * np.sum((sa["s2"] - sb["s2"]) ** 2))


# ------------------------------------------------------------------------------------- E-step


def test_pg_mean_closed_form_series_and_laplace_transform():
    c = np.array([0.0, 1e-9, 1e-5, 9.99e-5, 1.01e-4, 0.3, 1.0, 5.0, 40.0, 1e4])
    got = pg_mean(c)
    assert got[0] == 0.25 and np.all(got <= 0.25) and np.all(np.diff(got) <= 0)
    assert np.array_equal(pg_mean(-c), got)
    big = c >= 1e-3
    np.testing.assert_allclose(got[big], np.tanh(c[big] / 2) / (2 * c[big]), rtol=1e-14)
    # continuity across the series threshold (the series error is < c^4 / 480)
    assert abs(pg_mean(np.array([1e-4 - 1e-12]))[0] - math.tanh(5e-5) / 2e-4) < 1e-15
    # E[omega] = -d/dt E[exp(-t omega)] at 0, with E[exp(-t omega)] = cosh(c/2) / cosh(sqrt(c^2/4 + t/2))
    # for PG(1, c) (Polson, Scott & Windle 2013); central difference error ~ h^2 f''' / 6 < 1e-9.
    for cc in (0.0, 0.7, 3.0, 12.0):
        # cosh(sqrt(u)) is entire in u: evaluate through the complex sqrt when u < 0 (c = 0)
        lt = lambda t, cc=cc: math.cosh(cc / 2) / cmath.cosh(cmath.sqrt(cc * cc / 4 + t / 2)).real  # noqa: E731
        h = 1e-5
        assert abs(-(lt(h) - lt(-h)) / (2 * h) - pg_mean(np.array([cc]))[0]) < 1e-8


def test_pg_mean_matches_monte_carlo():
    """PG(1, c) = (1 / 2 pi^2) sum_k g_k / ((k - 1/2)^2 + c^2 / (4 pi^2)), g_k ~ Exp(1).

    The first K = 60 terms are sampled; the tail k > K enters with its exact mean, so the
    estimator is unbiased. Its variance per draw is (1 / 4 pi^4) sum_{k <= K} 1 / ((k - 1/2)^2 +
    c^2 / 4 pi^2)^2, computed exactly; the test allows 5 standard errors.
    """
    rng = np.random.default_rng(7)
    K, n = 60, 40_000
    k = np.arange(1, K + 1)
    k_tail = np.arange(K + 1, 2_000_000)
    for c in (0.0, 0.5, 2.0, 8.0):
        denom = (k - 0.5) ** 2 + c * c / (4 * math.pi**2)
        tail = np.sum(1.0 / ((k_tail - 0.5) ** 2 + c * c / (4 * math.pi**2))) / (2 * math.pi**2)
        tail += 1.0 / (2 * math.pi**2 * (k_tail[-1] + 0.5))  # integral bound of the rest, < 3e-8
        draws = (rng.exponential(size=(n, K)) / denom).sum(axis=1) / (2 * math.pi**2) + tail
        se = math.sqrt(np.sum(1.0 / denom**2) / (4 * math.pi**4) / n)
        assert abs(draws.mean() - pg_mean(np.array([c]))[0]) < 5 * se + 1e-7


def test_c_squared_is_x_second_moment_x():
    rng = np.random.default_rng(1)
    d = 6
    model = BayesianLogisticRegression(d, 100)
    A = rng.normal(size=(d, d))
    mu = rng.normal(size=d)
    M = A @ A.T / d + np.eye(d) * 0.1 + np.outer(mu, mu)
    set_second_moment(model, M, mu)
    X = rng.normal(size=(50, d)) / math.sqrt(d)
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    y = (rng.random(50) < 0.5).astype(float)
    sums = model.clipped_sum({"x": X, "y": y})
    omega = np.array([pg_mean(np.array([math.sqrt(x @ M @ x)]))[0] for x in X])
    np.testing.assert_allclose(sums["s1"], sum((t - 0.5) * x for x, t in zip(X, y)), atol=1e-13)
    np.testing.assert_allclose(sums["s2"], sum(o * np.outer(x, x) for o, x in zip(omega, X)), atol=1e-13)


def reference_e_step(X, y, Sigma, mu):
    """The E-step written record by record from its definition: clip x to norm 1, map y to
    {0, 1}, c^2 = x^T (Sigma + mu mu^T) x, E[omega] = tanh(c/2) / (2c), then the two sums."""
    M = Sigma + np.outer(mu, mu)
    s1, s2 = np.zeros(len(mu)), np.zeros((len(mu), len(mu)))
    for x, t in zip(np.asarray(X, dtype=float), y):
        x = x / max(1.0, math.sqrt(x @ x))
        c = math.sqrt(max(float(x @ M @ x), 0.0))
        omega = 0.25 if c == 0.0 else math.tanh(c / 2.0) / (2.0 * c)
        s1 += ((1.0 if t > 0.5 else 0.0) - 0.5) * x
        s2 += omega * np.outer(x, x)
    return s1, s2


@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-10), ("float32", 1e-5)])
@pytest.mark.parametrize("block_rows", [1, 7, 64, 10_000])
def test_e_step_matches_record_by_record_reference_for_any_row_blocking(dtype, rtol, block_rows):
    """The blocked, in-place E-step equals the definition (to 1e-10 relative in float64) for
    blocks of 1 row, uneven blocks, and one block; the input batch is left untouched, S2 is exactly
    symmetric, and after each M-step the E-step uses the new posterior (no stale cache)."""
    rng = np.random.default_rng(21)
    n, d = 64 + 29, 7
    model = BayesianLogisticRegression(d, n, dtype=dtype)
    model._e_step_rows = block_rows
    A = rng.normal(size=(d, d))
    mu = rng.normal(size=d)
    set_second_moment(model, A @ A.T / d + 0.1 * np.eye(d) + np.outer(mu, mu), mu)
    X = (rng.normal(size=(n, d)) / math.sqrt(d) * rng.uniform(0.2, 3.0, size=(n, 1))).astype(dtype)
    assert np.sum(np.linalg.norm(X, axis=1) > 1) > 10  # many rows are clipped behind the wall
    y = np.where(rng.random(n) < 0.5, 0.0, 1.0)
    y[:3] = [0.7, np.nan, -2.0]  # hostile labels: mapped to 1, 0, 0
    batch = {"x": X, "y": y}
    kept = {k: v.copy() for k, v in batch.items()}
    for _ in range(3):
        sums = model.clipped_sum(batch)
        ref_s1, ref_s2 = reference_e_step(X, y, model.Sigma, model.mu)
        np.testing.assert_allclose(sums["s1"], ref_s1, rtol=0, atol=rtol * np.abs(ref_s1).max())
        np.testing.assert_allclose(sums["s2"], ref_s2, rtol=0, atol=rtol * np.abs(ref_s2).max())
        assert sums["s2"].dtype == np.float64 and np.array_equal(sums["s2"], sums["s2"].T)
        for k in batch:
            np.testing.assert_array_equal(batch[k], kept[k])
        model.update({"s1": sums["s1"] / n, "s2": sums["s2"] / n + 0.01 * np.eye(d)}, 0.5)


def test_e_step_of_an_empty_batch_is_zero():
    model = BayesianLogisticRegression(4, 10)
    sums = model.clipped_sum({"x": np.zeros((0, 4)), "y": np.zeros(0)})
    assert np.array_equal(sums["s1"], np.zeros(4)) and np.array_equal(sums["s2"], np.zeros((4, 4)))


# ------------------------------------------------------------------------------------- z = 0


def test_noiseless_full_batch_steps_equal_batch_vb_iterations():
    """rho = 1 with the whole data set as batch is exactly one batch VB sweep per step."""
    rng = np.random.default_rng(2)
    X, y = synthetic(rng, 400, 4)
    a0, b0 = 2.0, 0.5
    model = BayesianLogisticRegression(4, 400, a0=a0, b0=b0)
    for _ in range(3):
        model.update(full_batch_mean(model, X, y), rho=1.0)
    mu, Sigma, alpha = batch_vb(X, y, a0, b0, iters=3)
    np.testing.assert_allclose(model.mu, mu, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.Sigma, Sigma, rtol=1e-9, atol=1e-12)
    assert model.alpha_mean == pytest.approx(alpha, rel=1e-10)


def test_noiseless_engine_converges_to_batch_vb_posterior():
    """Through the engine (non-private mode, z = 0, full-batch fixed-size sampling, decaying
    Robbins-Monro steps) the averaged natural parameters reach the batch VB fixed point."""
    rng = np.random.default_rng(3)
    n, d = 300, 3
    X, y = synthetic(rng, n, d)
    assert 0 < y.mean() < 1
    model = BayesianLogisticRegression(d, n, a0=1.0, b0=1.0)
    reservoir = Reservoir(model.row_layout(), n, np.random.default_rng(0))
    parsed = model.parse_batch([{"x": x.tolist(), "y": int(t)} for x, t in zip(X, y)])
    reservoir.add_batch(parsed.rows)
    engine = PrivateEngine(model, reservoir, FixedSizeSampler(n), None, 0.0, np.random.default_rng(1),
                           tau0=1.0, kappa=0.51, accountant_name="none", non_private=True)
    for _ in range(600):
        engine.step()
    mu, Sigma, alpha = batch_vb(X, y, 1.0, 1.0)
    # The damped iteration contracts by ~(1 - rho_t (1 - L)) per step; sum of rho_t over 600
    # steps is ~47, so the distance left is far below the tolerance used here.
    np.testing.assert_allclose(model.mu, mu, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(model.Sigma, Sigma, rtol=1e-7, atol=1e-9)
    assert model.alpha_mean == pytest.approx(alpha, rel=1e-7)


# ------------------------------------------------------------------------------------- M-step


def test_released_precision_is_always_positive_definite():
    rng = np.random.default_rng(4)
    d, N = 8, 1000
    for _trial in range(200):
        model = BayesianLogisticRegression(d, N, a0=1.0, b0=float(rng.uniform(0.01, 100)))
        std = float(rng.choice([0.0, 1e-4, 1e-2, 1.0]))
        model.set_noise_scale({"s1": std, "s2": std})
        for _ in range(3):
            G = rng.normal(size=(d, d)) * rng.choice([1e-3, 1.0, 1e3])
            s2 = (G + G.T) / 2 - rng.uniform(0, 10) * np.eye(d)  # indefinite or negative definite
            s1 = rng.normal(size=d) * 10
            model.update({"s1": s1, "s2": s2}, float(rng.uniform(0.01, 1.0)))
            st = model.state()
            P = st["precision"]
            eig = np.linalg.eigvalsh(P)
            assert np.allclose(P, P.T) and eig[0] > 0
            # P = N proj(S / N) + A I has eigenvalues >= N * floor + A, up to the rounding of
            # the eigendecomposition (a few ulps of the largest eigenvalue)
            assert eig[0] >= N * model.eigen_floor + st["alpha"][2] - 1e-12 * eig[-1]
            assert np.all(np.isfinite(model.mu)) and np.all(np.isfinite(model.Sigma))


def test_eigen_floor_follows_the_public_noise_of_the_average():
    """Per-step noise std s on S / N entries; after blending with steps rho_t the noise std is
    s * sqrt(sum_t w_t^2), w_t the final weight of step t; the floor is floor_factor sqrt(d) times it."""
    model = BayesianLogisticRegression(16, 100, floor_factor=2.0)
    model.set_noise_scale({"s1": 0.3, "s2": 0.01})
    assert model.hyperparameters()["s2_noise_std"] == 0.01
    rhos = [1.0, 0.5, 0.2, 0.2]
    for rho in rhos:
        model.update({"s1": np.zeros(16), "s2": np.zeros((16, 16))}, rho)
    w = [r * np.prod([1 - later for later in rhos[i + 1:]]) for i, r in enumerate(rhos)]
    assert model.eigen_floor == pytest.approx(2.0 * 4 * 0.01 * math.sqrt(np.sum(np.square(w))))
    assert np.linalg.eigvalsh(model.state()["precision"])[0] >= 100 * model.eigen_floor
    with pytest.raises(ValueError, match="s2 noise std"):
        model.set_noise_scale({"s1": 0.0, "s2": -1.0})


def test_precision_equals_projection_of_the_average_on_both_paths():
    """P = N project_pd(S / N, floor) + A I whether or not S / N is already above the floor
    (the model skips the eigendecomposition when a Cholesky test shows it is)."""
    from stream_vips.privacy.mechanisms import project_pd

    rng = np.random.default_rng(17)
    d, N = 6, 200
    for above in (True, False):  # all eigenvalues above the floor (~0.025) / some negative
        model = BayesianLogisticRegression(d, N)
        model.set_noise_scale({"s1": 0.01, "s2": 0.01})
        G = rng.normal(size=(d, d)) / 10
        s2 = G @ G.T + 0.5 * np.eye(d) if above else G + G.T
        model.update({"s1": np.zeros(d), "s2": s2}, 1.0)
        st = model.state()
        expected = N * project_pd(st["s2_blend"] / N, model.eigen_floor) + st["alpha"][2] * np.eye(d)
        np.testing.assert_allclose(st["precision"], expected, rtol=1e-10, atol=1e-10 * N)


def test_m_step_blends_natural_parameters_and_updates_alpha():
    rng = np.random.default_rng(5)
    d, N = 3, 50
    model = BayesianLogisticRegression(d, N, a0=3.0, b0=2.0)
    h0, P0 = model.state()["h"], model.state()["precision"]
    assert np.allclose(P0, 1.5 * np.eye(d))  # prior mean of alpha, a0 / b0
    A = rng.normal(size=(d, d))
    s2, s1 = A @ A.T / 10, rng.normal(size=d) / 10
    model.update({"s1": s1, "s2": s2}, rho=0.3)
    st = model.state()
    np.testing.assert_allclose(st["h"], 0.7 * h0 + 0.3 * N * s1)
    np.testing.assert_allclose(st["s2_blend"], 0.3 * N * s2, rtol=1e-12)
    # nu = 0.7 nu_prior + 0.3 [N s1, N s2 + <alpha> I]; s2 is PSD, so the projection is inactive
    np.testing.assert_allclose(st["precision"], 0.7 * P0 + 0.3 * (N * s2 + 1.5 * np.eye(d)), rtol=1e-10)
    Sigma = np.linalg.inv(st["precision"])
    mu = Sigma @ st["h"]
    assert st["alpha"][0] == 3.0 + d / 2
    assert st["alpha"][1] == pytest.approx(2.0 + 0.5 * (mu @ mu + np.trace(Sigma)))
    alpha_new = st["alpha"][0] / st["alpha"][1]
    model.update({"s1": s1, "s2": s2}, rho=0.5)
    assert model.state()["alpha"][2] == pytest.approx(0.5 * 1.5 + 0.5 * alpha_new)


# ------------------------------------------------------------------------------ sensitivities


def test_block_bounds_hold_and_are_attained():
    rng = np.random.default_rng(6)
    d = 5
    model = BayesianLogisticRegression(d, 10)
    assert [(b.name, b.shape, b.bound, b.symmetric) for b in model.blocks()] == [
        ("s1", (d,), C1, False), ("s2", (d, d), C2, True)]
    # worst case: unit-norm x and E[m m^T] -> 0, so c -> 0 and E[omega] -> 1/4
    set_second_moment(model, 1e-12 * np.eye(d))
    x = rng.normal(size=d)
    s = model.clipped_sum({"x": (5 * x / np.linalg.norm(x))[None, :], "y": np.array([1.0])})
    assert np.linalg.norm(s["s1"]) == pytest.approx(C1, rel=1e-12)
    assert np.linalg.norm(s["s2"]) == pytest.approx(C2, rel=1e-9)
    # random records and random posteriors never exceed the bounds
    for _ in range(300):
        A = rng.normal(size=(d, d)) * rng.choice([1e-3, 1.0, 30.0])
        set_second_moment(model, A @ A.T + 1e-6 * np.eye(d))
        x = rng.normal(size=d) * rng.choice([0.1, 1.0, 100.0])
        s = model.clipped_sum({"x": x[None, :], "y": np.array([float(rng.integers(2))])})
        assert np.linalg.norm(s["s1"]) <= C1 * (1 + 1e-12)
        assert np.linalg.norm(s["s2"]) <= C2 * (1 + 1e-12)


def test_replace_one_block_sensitivities_closed_form():
    """s1: 2 C1 = 1 (same x, flipped label); s2: sqrt(2) C2 (orthogonal unit inputs, c -> 0)."""
    d = 4
    model = BayesianLogisticRegression(d, 10)
    set_second_moment(model, 1e-12 * np.eye(d))
    e = np.eye(d)
    one = lambda x, y: model.clipped_sum({"x": x[None, :], "y": np.array([y])})  # noqa: E731
    a, b = one(e[0], 1.0), one(e[0], 0.0)
    assert np.linalg.norm(a["s1"] - b["s1"]) == pytest.approx(2 * C1)
    a, b = one(e[0], 1.0), one(e[1], 1.0)
    assert np.linalg.norm(a["s2"] - b["s2"]) == pytest.approx(math.sqrt(2) * C2, rel=1e-9)
    rng = np.random.default_rng(8)
    for _ in range(300):
        A = rng.normal(size=(d, d)) * rng.choice([1e-3, 1.0, 30.0])
        set_second_moment(model, A @ A.T + 1e-6 * np.eye(d))
        xa, xb = rng.normal(size=(2, d)) * rng.choice([0.5, 3.0])
        a, b = one(xa, float(rng.integers(2))), one(xb, float(rng.integers(2)))
        assert np.linalg.norm(a["s1"] - b["s1"]) <= 2 * C1 * (1 + 1e-12)
        assert np.linalg.norm(a["s2"] - b["s2"]) <= math.sqrt(2) * C2 * (1 + 1e-12)


@pytest.mark.parametrize("a1sq", [0.05, 0.3, 0.5, 0.66, 0.8, 0.95])
def test_joint_diameter_matches_numerical_worst_case(a1sq):
    """The closed form equals the sup found by optimizing the reduced problem of the docstring
    over (|x|, |x'|, omega |x|^2, omega' |x'|^2, signed cosine) from many starts."""
    a1, a2 = math.sqrt(a1sq), math.sqrt(1 - a1sq)
    w1, w2 = a1 / C1, a2 / C2

    def neg_d2(v):
        r, rp, bp, bpp, t = v
        p, pp = bp * r * r / 4, bpp * rp * rp / 4
        return -(w1**2 * (r * r + rp * rp - 2 * t * r * rp) / 4 + w2**2 * (p * p + pp * pp - 2 * t * t * p * pp))

    rng = np.random.default_rng(9)
    best = 0.0
    for _ in range(60):
        x0 = np.concatenate([rng.random(4), rng.uniform(-1, 1, 1)])
        res = minimize(neg_d2, x0, bounds=[(0, 1)] * 4 + [(-1, 1)], method="L-BFGS-B")
        best = max(best, -res.fun)
    assert joint_diameter(a1, a2) == pytest.approx(math.sqrt(best), rel=1e-6)
    assert joint_diameter(a1, a2) <= 2.0


def test_joint_diameter_bounds_real_neighbours_and_is_approached():
    d = 4
    model = BayesianLogisticRegression(d, 10)
    default = (C1 / math.hypot(C1, C2), C2 / math.hypot(C1, C2))
    D = model.diameter({"s1": default[0], "s2": default[1]})
    assert D == pytest.approx(math.sqrt(3.4)) and model.diameter() == 2.0
    rng = np.random.default_rng(10)
    for _ in range(400):
        weights = rng.uniform(0.05, 1, 2)
        weights /= np.linalg.norm(weights)
        Dw = joint_diameter(*weights)
        A = rng.normal(size=(d, d)) * rng.choice([1e-4, 1.0, 100.0])
        set_second_moment(model, A @ A.T + 1e-8 * np.eye(d))
        xa = rng.normal(size=d)
        xb = rng.normal(size=d) if rng.random() < 0.5 else -xa + 0.01 * rng.normal(size=d)
        ya, yb = float(rng.integers(2)), float(rng.integers(2))
        assert scaled_difference(model, (xa * 5, ya), (xb * 5, yb), weights) <= Dw * (1 + 1e-12)
    # near-worst case for default weights: x' ~ x with flipped label, omega(x) ~ 1/4, omega(x') ~ 0
    theta = 1e-3
    x, xp = np.eye(d)[0], math.cos(theta) * np.eye(d)[0] + math.sin(theta) * np.eye(d)[1]
    M = 1e-10 * np.eye(d)
    M[1, 1] += 1e18  # diagonal, so exactly invertible: c(x) ~ 1e-5, c(x') = 1e9 sin(theta) ~ 1e6
    set_second_moment(model, M)
    assert scaled_difference(model, (x, 1.0), (xp, 0.0), default) == pytest.approx(D, rel=1e-6)


def exact_squared_norm(v):
    """||v||^2 of a float array in exact rational arithmetic (no rounding can hide an excess)."""
    return sum(Fraction(float(t)) ** 2 for t in np.ravel(v))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_rows_at_the_norm_bound_are_clipped_to_it_exactly(dtype):
    """Rows normalised to norm 1 in floating point have a computed norm up to a few ulps above 1:
    the clip factor comes from the norm inflated by d eps, so every released s1 = f x / 2 has
    exact squared norm <= C1^2 = 1/4, in float64 and in float32 (module docstring: the clipped
    norm is <= 1 even in float32). A norm deflated instead lets about half of them through."""
    rng = np.random.default_rng(31)
    for d in (2, 5):
        model = BayesianLogisticRegression(d, 10, dtype=dtype)
        X = rng.normal(size=(120, d))
        X = (X / np.linalg.norm(X, axis=1)[:, None]).astype(dtype)
        for x in X:
            s = model.clipped_sum({"x": x[None, :], "y": np.array([1.0])})
            assert exact_squared_norm(s["s1"]) <= Fraction(1, 4), (d, x)


def test_float32_e_step_allocates_no_float64_copy_of_the_batch():
    """float32 storage is there to halve memory, and the E-step allocates no n x d temporary
    (:meth:`_second_moment`): clipped_sum's peak allocation stays well below the size of the
    float32 batch itself (it is a few length-n vectors and one row block; a float64 copy of X
    would be twice the batch)."""
    n, d = 50_000, 64
    rng = np.random.default_rng(32)
    X = (rng.normal(size=(n, d)) / 8).astype(np.float32)
    y = (rng.random(n) < 0.5).astype(float)
    model = BayesianLogisticRegression(d, n, dtype="float32")
    model.clipped_sum({"x": X[:10], "y": y[:10]})  # first-call allocations (BLAS, caches) out of the way
    tracemalloc.start()
    try:
        model.clipped_sum({"x": X, "y": y})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * X.nbytes


def key_level_reference(model, X, y, groups, n_groups, bound):
    """Per key: the record-level sums of its records (clipped_sum), scaled by one factor
    min(1, bound / ||vector sum||, C2 / ||S2 sum||_F), then added over keys (privacy rule 12)."""
    first = model.blocks()[0].name
    out = {first: np.zeros(model.dim), "s2": np.zeros((model.dim, model.dim))}
    for k in range(n_groups):
        part = model.clipped_sum({"x": X[groups == k], "y": y[groups == k]})
        n1, n2 = np.linalg.norm(part[first]), np.linalg.norm(part["s2"])
        scale = min(1.0, bound / n1 if n1 > bound else 1.0, C2 / n2 if n2 > C2 else 1.0)
        for name in out:
            out[name] += scale * part[name]
    return out


@pytest.mark.parametrize("release", ["sums", "centred"])
def test_key_level_sums_equal_a_per_key_reference(release):
    """group_clipped_sum against a brute-force per-key computation from clipped_sum: a key of one
    record releases exactly that record's sums (its blocks are within their bounds already), and
    random keys release the sum of their key sums, each scaled into both block bounds. Rows beyond
    norm 1 and, for the centred release, an iterate far from 0 exercise the clip factor f inside
    the residual (y - 1/2 - E[omega] f x^T m)."""
    rng = np.random.default_rng(33)
    d, n = 4, 60
    if release == "centred":
        model, bound = BayesianLogisticRegression(d, 10, release="centred", residual_clip=0.3), 0.3
        mu = np.array([3.0, -2.0, 1.0, 0.5])
    else:
        model, bound, mu = BayesianLogisticRegression(d, 10), C1, np.zeros(d)
    A = rng.normal(size=(d, d))
    P = np.linalg.inv(A @ A.T / d + 0.1 * np.eye(d))
    P = (P + P.T) / 2
    state = {"h": P @ mu, "precision": P, "s2_blend": P - 1e-30 * np.eye(d),
             "alpha": np.array([1.0, 1.0, 1e-30]), "noise_var": np.array([0.0])}
    if release == "centred":  # the iterate is the centred release's linearisation point
        state.update(iterate=mu, mean_sum=np.zeros(d), counts=np.zeros(3))
    model.load_state(state)
    X = rng.normal(size=(n, d)) * rng.uniform(0.2, 2.0, size=(n, 1))
    assert np.sum(np.linalg.norm(X, axis=1) > 1) > 10
    y = (rng.random(n) < 0.5).astype(float)
    first = model.blocks()[0].name
    single = model.group_clipped_sum({"x": X, "y": y}, np.arange(n), n)
    plain = model.clipped_sum({"x": X, "y": y})
    for name in (first, "s2"):
        np.testing.assert_allclose(single[name], plain[name], rtol=1e-12, atol=1e-14)
    for x, t in zip(X[:5], y[:5]):  # and one record in one key is that record
        one = model.group_clipped_sum({"x": x[None, :], "y": np.array([t])}, np.zeros(1, dtype=int), 1)
        two = model.clipped_sum({"x": x[None, :], "y": np.array([t])})
        np.testing.assert_allclose(one[first], two[first], rtol=1e-12, atol=1e-15)
    groups = rng.integers(0, 5, n)
    got = model.group_clipped_sum({"x": X, "y": y}, groups, 6)  # key 5 is empty
    want = key_level_reference(model, X, y, groups, 6, bound)
    for name in (first, "s2"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-14)


def test_a_key_whose_labels_cancel_is_still_clipped_by_its_second_moment():
    """40 records x = e1 with alternating labels: s1 cancels to 0 (within its bound), while S2 =
    40 E[omega] e1 e1^T (E[omega] -> 1/4 at c -> 0) is 40 times C2; the key's one factor must bring
    ||S2_g||_F to C2 = 1/4, the s2 bound the diameter assumes."""
    d = 3
    model = BayesianLogisticRegression(d, 10)
    set_second_moment(model, 1e-12 * np.eye(d))
    X = np.tile(np.eye(d)[0], (40, 1))
    y = np.tile([0.0, 1.0], 20)
    s = model.group_clipped_sum({"x": X, "y": y}, np.zeros(40, dtype=int), 1)
    assert np.linalg.norm(s["s1"]) <= 1e-15
    assert np.linalg.norm(s["s2"]) == pytest.approx(C2, rel=1e-9)
    assert np.linalg.norm(s["s2"]) <= C2 * (1 + 1e-12)


def test_key_level_diameter_closed_form_and_refusals():
    """group_diameter is sqrt(4 a1^2 + 2 a2^2) for normalised weights (sqrt(3.6) for the default
    a_k ~ C_k), never above 2, and 2 without weights (the value for every allocation); weights
    that are zero, negative or not finite are refused as for the record-level diameter."""
    model = BayesianLogisticRegression(4, 10)
    assert model.group_diameter() == 2.0
    default = {"s1": C1 / math.hypot(C1, C2), "s2": C2 / math.hypot(C1, C2)}
    assert model.group_diameter(default) == pytest.approx(math.sqrt(3.6), rel=1e-12)
    rng = np.random.default_rng(34)
    for a1, a2 in rng.uniform(0.01, 3.0, size=(50, 2)):
        u1 = a1 * a1 / (a1 * a1 + a2 * a2)
        D = model.group_diameter({"s1": a1, "s2": a2})
        assert D == pytest.approx(math.sqrt(4 * u1 + 2 * (1 - u1)), rel=1e-12)
        assert model.diameter({"s1": a1, "s2": a2}) <= D <= 2.0
    centred = BayesianLogisticRegression(4, 10, release="centred")
    assert centred.group_diameter({"g": 1.0, "s2": 1.0}) == pytest.approx(math.sqrt(3.0), rel=1e-12)
    for bad in ((0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (1.0, -0.5), (math.inf, 1.0), (1.0, math.nan)):
        with pytest.raises(ValueError, match="positive"):
            model.group_diameter({"s1": bad[0], "s2": bad[1]})


# ------------------------------------------------------------------------------------- engine


def private_engine(model, n, X, y, z, sampler, accountant, seed=0, block_weights=None, budget=10.0):
    reservoir = Reservoir(model.row_layout(), n, np.random.default_rng(seed))
    reservoir.add_batch({"x": X, "y": y})
    ledger = MemoryLedger()
    monitor = BudgetMonitor(budget, 1e-5, accountant, ledger)
    engine = PrivateEngine(model, reservoir, sampler, monitor, z, np.random.default_rng(seed + 1),
                           tau0=10.0, kappa=0.7, accountant_name=accountant.name,
                           block_weights=block_weights, seeded=True)
    return engine, ledger


@pytest.mark.parametrize("block_weights", [None, {"s1": 1.0, "s2": 3.0}])
def test_noise_std_per_block_is_z_times_bound_over_weight(block_weights):
    """The engine adds std z C_k / a_k to block sums; the model sees it divided by S. The
    captured noise, standardized, is a sum of squares of independent N(0, 1): chi-square with
    n degrees of freedom, checked within 5 standard deviations sqrt(2 n)."""
    rng = np.random.default_rng(11)
    n, d, S, z, steps = 200, 12, 50, 1.7, 40
    X, y = synthetic(rng, n, d)
    captured = []

    class Capturing(BayesianLogisticRegression):
        def clipped_sum(self, batch):
            self._last = super().clipped_sum(batch)
            return self._last

        def update(self, noisy_mean, rho):
            captured.append({k: noisy_mean[k] * S - self._last[k] for k in noisy_mean})
            super().update(noisy_mean, rho)

    model = Capturing(d, n)
    engine, _ = private_engine(model, n, X, y, z, FixedSizeSampler(S), RdpAccountant(),
                                block_weights=block_weights, budget=1e6)
    if block_weights is None:
        a = np.array([C1, C2]) / math.hypot(C1, C2)
    else:
        a = np.array([1.0, 3.0]) / math.sqrt(10.0)
    expected = {"s1": z * C1 / a[0], "s2": z * C2 / a[1]}
    assert engine.block_stds == pytest.approx(expected, rel=1e-12)
    for _ in range(steps):
        engine.step()
    iu = np.triu_indices(d, 1)
    z1 = np.concatenate([c["s1"] for c in captured]) / expected["s1"]
    zd = np.concatenate([np.diag(c["s2"]) for c in captured]) / expected["s2"]
    zo = np.concatenate([c["s2"][iu] for c in captured]) / (expected["s2"] / math.sqrt(2))
    assert all(np.allclose(c["s2"], c["s2"].T) for c in captured)
    for sample in (z1, zd, zo):
        k = sample.size
        assert abs(np.sum(sample**2) - k) < 5 * math.sqrt(2 * k)


def test_published_epsilon_equals_ledger_epsilon():
    rng = np.random.default_rng(12)
    n, d = 400, 5
    X, y = synthetic(rng, n, d)
    model = BayesianLogisticRegression(d, n)
    engine, ledger = private_engine(model, n, X, y, 2.0, PoissonSampler(0.2), PldAccountant(), budget=3.0)
    for _ in range(5):
        result = engine.step()
    privacy = engine.privacy_report(steps=result.step + 1, halted=False)
    msg = messages.build_message("m", model.family, model.hyperparameters(), result.step,
                                 model.state(), privacy)
    msg = messages.loads(messages.dumps(msg))
    assert len(ledger.events()) == 5 and msg["version"] == 4
    assert msg["privacy"]["epsilon_spent"] == pytest.approx(PldAccountant().epsilon(ledger.events(), 1e-5), rel=1e-12)
    assert msg["privacy"]["noise_multiplier"] == 2.0
    restored = BayesianLogisticRegression(d, n)
    restored.load_state(messages.decode_state(msg))
    np.testing.assert_allclose(restored.predict_proba(X), model.predict_proba(X), rtol=1e-12)


def test_private_run_learns_on_synthetic_data():
    """A moderately noisy private run still ranks held-out data far better than chance."""
    rng = np.random.default_rng(13)
    n, d = 4000, 6
    X, y = synthetic(rng, 2 * n, d, scale=6.0)
    model = BayesianLogisticRegression(d, n)
    engine, _ = private_engine(model, n, X[:n], y[:n], 1.0, FixedSizeSampler(n // 4), RdpAccountant(), budget=1e3)
    model.set_noise_scale({k: s / engine.normaliser for k, s in engine.block_stds.items()})
    for _ in range(20):
        engine.step()
    assert roc_auc(y[n:], model.predict_proba(X[n:])) > 0.75


# ------------------------------------------------------------------------------------ records


def test_record_beyond_the_norm_bound_is_clipped():
    model = BayesianLogisticRegression(3, 10)
    parsed = model.parse_batch([{"x": [30.0, 40.0, 0.0], "y": 1}, {"x": [0.1, 0.2, 0.2], "y": 0}])
    np.testing.assert_allclose(parsed.rows["x"], [[0.6, 0.8, 0.0], [0.1, 0.2, 0.2]])
    # clipped_sum clips again, whatever reached the reservoir
    s = model.clipped_sum({"x": np.array([[300.0, 400.0, 0.0]]), "y": np.array([1.0])})
    np.testing.assert_allclose(s["s1"], [0.3, 0.4, 0.0])
    assert np.linalg.norm(s["s2"]) <= C2


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_hostile_labels_behind_the_wall_keep_every_record_within_the_block_bounds(dtype):
    """Labels that parsing would reject, fed straight to clipped_sum, are mapped to {0, 1}:
    each record's s1 is exactly +-(1/2) x (so ||s1|| <= C1) and s2 <= C2, finite, one record at a time."""
    rng = np.random.default_rng(11)
    d = 4
    model = BayesianLogisticRegression(d, 10, dtype=dtype)
    set_second_moment(model, 1e-12 * np.eye(d))  # c -> 0: E[omega] -> 1/4, the s2 worst case
    hostile = [7.0, -3.0, math.nan, math.inf, -math.inf, 1e300, 0.5, 0.51, 2.0, -1.0]
    mapped = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    # float32 rounding of a unit-norm row and its products: a few ulps, far below 1e-5 relative
    tol = 1e-12 if dtype == "float64" else 1e-5
    X = rng.normal(size=(len(hostile), d)) * 10.0  # beyond the norm bound: clipping is exercised too
    for x, y, m in zip(X, hostile, mapped):
        s = model.clipped_sum({"x": x[None, :], "y": np.array([y])})
        assert np.all(np.isfinite(s["s1"])) and np.all(np.isfinite(s["s2"]))
        np.testing.assert_allclose(s["s1"], (m - 0.5) * x / np.linalg.norm(x), rtol=tol, atol=tol)
        assert np.linalg.norm(s["s1"]) <= C1 * (1 + tol)
        assert np.linalg.norm(s["s2"]) <= C2 * (1 + tol)
    # and a batch of them sums exactly as the same batch with the mapped labels
    hostile_sum = model.clipped_sum({"x": X, "y": np.array(hostile)})
    mapped_sum = model.clipped_sum({"x": X, "y": np.array(mapped)})
    for name in ("s1", "s2"):
        np.testing.assert_array_equal(hostile_sum[name], mapped_sum[name])


def test_parse_batch_rejects_malformed_records_with_reasons():
    model = BayesianLogisticRegression(2, 10)
    objs = [
        {"x": [0.1, 0.2], "y": 1},
        {"x": [0.1, 0.2], "y": 2},
        {"x": [0.1, 0.2], "y": 0.5},
        {"x": [float("nan"), 0.2], "y": 0},
        {"x": [0.1, 0.2, 0.3], "y": 0},
        {"x": [0.1, 0.2]},
        {"x": "0.1,0.2", "y": 1},
        {"x": [0.1, 0.2], "y": "1"},
        [0.1, 0.2, 1],
        {"x": [0.3, 0.4], "y": 0.0},
    ]
    parsed = model.parse_batch(objs)
    assert parsed.accepted.tolist() == [0, 9]
    assert parsed.rows["y"].tolist() == [1.0, 0.0]
    reasons = {i: r for i, r, _ in parsed.rejected}
    assert reasons == {1: "out_of_range", 2: "out_of_range", 3: "non_finite", 4: "wrong_shape",
                       5: "missing_field", 6: "wrong_type", 7: "wrong_type", 8: "not_object"}
    details = {i: t for i, _, t in parsed.rejected}
    assert "0 or 1" in details[1] and "'y'" in details[5]


# ---------------------------------------------------------------------------------- prediction


def test_predictive_probit_approximation_and_metrics():
    rng = np.random.default_rng(14)
    d = 4
    model = BayesianLogisticRegression(d, 100)
    A = rng.normal(size=(d, d))
    mu = rng.normal(size=d)
    set_second_moment(model, A @ A.T + np.outer(mu, mu), mu)
    X = rng.normal(size=(300, d)) / 2
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    p = model.predict_proba(X)
    # Monte Carlo of E[sigmoid(m^T x)] under q(m); the probit approximation is within 0.02 of it
    # (its max error over all means a and sds s, by Gauss-Hermite quadrature on a grid, is 0.016)
    m = rng.multivariate_normal(mu, A @ A.T, size=20_000)
    exact = (1.0 / (1.0 + np.exp(-(X @ m.T)))).mean(axis=1)
    assert np.max(np.abs(p - exact)) < 0.02 + 5 * 0.5 / math.sqrt(20_000)
    sk = pytest.importorskip("sklearn.metrics")
    yy = (rng.random(300) < p).astype(float)
    assert roc_auc(yy, p) == pytest.approx(sk.roc_auc_score(yy, p), rel=1e-12)
    assert log_loss(yy, p) == pytest.approx(sk.log_loss(yy, p), rel=1e-12)
    ties = np.round(p, 1)
    assert roc_auc(yy, ties) == pytest.approx(sk.roc_auc_score(yy, ties), rel=1e-12)


def test_state_round_trip_and_bad_config():
    rng = np.random.default_rng(15)
    X, y = synthetic(rng, 100, 3)
    model = BayesianLogisticRegression(3, 100)
    model.update(full_batch_mean(model, X, y), 0.5)
    other = BayesianLogisticRegression(3, 100)
    other.load_state(model.state())
    assert other.alpha_mean == model.alpha_mean
    np.testing.assert_allclose(other.mu, model.mu)
    np.testing.assert_allclose(other.state()["precision"], model.state()["precision"])
    with pytest.raises(ValueError, match="symmetric"):
        other.load_state({**model.state(), "s2_blend": np.triu(np.ones((3, 3)))})
    with pytest.raises(ValueError, match="'h' must have shape"):
        other.load_state({**model.state(), "h": np.zeros(4)})
    with pytest.raises(ValueError, match="no 'noise_var'"):
        other.load_state({k: v for k, v in model.state().items() if k != "noise_var"})
    with pytest.raises(ValueError, match="dataset_size"):
        BayesianLogisticRegression(3, 0)
    with pytest.raises(ValueError, match="rho"):
        model.update(full_batch_mean(model, X, y), 0.0)


def test_float32_mode_matches_float64_to_single_precision():
    """float32 storage and E-step products: bounds still hold (clip factors in float64), and the
    sums agree with float64 to single-precision accuracy (a few 1e-7 relative per term, summed
    over n = 500 terms with blocked accumulation: well inside 1e-5 of the largest entry)."""
    rng = np.random.default_rng(16)
    X, y = synthetic(rng, 500, 6)
    m64 = BayesianLogisticRegression(6, 500)
    m32 = BayesianLogisticRegression(6, 500, dtype="float32")
    assert m32.row_layout()["x"][0] == np.float32 and m32.hyperparameters()["dtype"] == "float32"
    rows = m32.parse_batch([{"x": (3 * x).tolist(), "y": int(t)} for x, t in zip(X, y)]).rows
    assert rows["x"].dtype == np.float32
    for _ in range(3):
        s64, s32 = m64.clipped_sum(rows), m32.clipped_sum(rows)
        for k in ("s1", "s2"):
            assert s32[k].dtype == np.float64
            np.testing.assert_allclose(s32[k], s64[k], atol=1e-5 * np.abs(s64[k]).max())
        m64.update({k: v / 500 for k, v in s64.items()}, 1.0)
        m32.update({k: v / 500 for k, v in s64.items()}, 1.0)  # same statistics: same posterior
    one = {"x": np.float32(5.0) * rows["x"][:1] / np.linalg.norm(rows["x"][:1]), "y": np.array([1.0])}
    s = m32.clipped_sum(one)
    assert np.linalg.norm(s["s1"]) <= C1 * (1 + 1e-6) and np.linalg.norm(s["s2"]) <= C2 * (1 + 1e-6)
    with pytest.raises(ValueError, match="dtype"):
        BayesianLogisticRegression(6, 500, dtype="float16")


def test_adult_encoding_uses_only_public_constants():
    """Each row's features depend on that row alone (public category lists and bounds, no
    statistic of the data), every row has norm 1 with the bias inside, '?' encodes as zeros,
    and a category outside the public list is refused."""
    datasets = pytest.importorskip("benchmarks.datasets")
    header = ["", "age", "workclass", "education", "education-num", "marital-status", "occupation",
              "relationship", "race", "gender", "capital-gain", "capital-loss", "hours-per-week",
              "native-country", "income"]
    rows = [
        ["0", "39", "State-gov", "Bachelors", "13", "Never-married", "Adm-clerical", "Not-in-family",
         "White", "Male", "2174", "0", "40", "United-States", "<=50K"],
        ["1", "90", "?", "Doctorate", "16", "Widowed", "?", "Unmarried", "Other", "Female", "99999",
         "4356", "99", "?", ">50K"],
        ["2", "17", "Private", "Preschool", "1", "Married-AF-spouse", "Armed-Forces", "Wife",
         "Amer-Indian-Eskimo", "Female", "0", "0", "1", "Holand-Netherlands", "<=50K"],
    ]
    X, y, names = datasets.encode_adult(header, rows)
    assert y.tolist() == [0.0, 1.0, 0.0] and names[-1] == "bias" and X.shape == (3, len(names))
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0)
    for i, row in enumerate(rows):
        alone, _, _ = datasets.encode_adult(header, [row])
        np.testing.assert_array_equal(alone[0], X[i])
    unknown = [j for j, n in enumerate(names) if n.startswith(("workclass=", "occupation=", "native-country="))]
    assert np.all(X[1, unknown] == 0)
    with pytest.raises(ValueError, match="public category list"):
        datasets.encode_adult(header, [rows[0][:2] + ["Space-force"] + rows[0][3:]])


def test_table_encoding_has_public_columns_and_encodes_missing_values():
    """The generic encoder behind the benchmark tables: the columns come from the arguments alone
    (an indicator only where declared, whether or not a value is missing), a missing numeric is 0
    (with its indicator 1 where declared), a missing category is all zeros, the first of repeated
    column names is read, and rows are features of themselves only."""
    datasets = pytest.importorskip("benchmarks.datasets")
    header = ["age", "fare", "sex", "age", "label"]
    rows = [["30", "50", "male", "999", "1"], ["?", "", "?", "1", "0"], ["120", "5000", "female", "0", "1"]]
    args = ({"age": ("linear", 100.0), "fare": ("log1p", 1000.0)}, {"sex": ("female", "male")}, ("label", "1"))
    X, y, names = datasets.encode_table(header, rows, *args, missing_indicators=("age",))
    assert names == ("age", "age=?", "fare", "sex=female", "sex=male", "bias") and y.tolist() == [1.0, 0.0, 1.0]
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0)
    raw = X / X[:, -1:]  # undo the row normalisation (the bias is 1 before it)
    np.testing.assert_allclose(raw[0], [0.3, 0.0, np.log1p(50) / np.log1p(1000), 0, 1, 1])
    np.testing.assert_allclose(raw[1], [0, 1, 0, 0, 0, 1])
    np.testing.assert_allclose(raw[2, :3], [1.0, 0.0, 1.0])  # clipped to the public bounds
    none_missing, _, same = datasets.encode_table(header, [rows[0]], *args, missing_indicators=("age",))
    assert same == names
    np.testing.assert_array_equal(none_missing[0], X[0])
    assert datasets.encode_table(header, rows, *args)[2] == ("age", "fare", "sex=female", "sex=male", "bias")
    with pytest.raises(ValueError, match="public category list"):
        datasets.encode_table(header, [["1", "1", "other", "1", "1"]], *args)
