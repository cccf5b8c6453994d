"""OPS baseline: scaled likelihood for the target epsilon, clipping bound, pure-DP release via the ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import log_expit, logsumexp

from stream_vips.engine import PrivateEngine
from stream_vips.models.baselines.ops import OPS
from stream_vips.privacy.accountant import PldAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import PureDpEvent
from stream_vips.privacy.ledger import MemoryLedger
from stream_vips.reservoir import Reservoir
from stream_vips.sampling import FixedSizeSampler, ReservoirNotFull


def test_scaled_likelihood_matches_the_target_epsilon_formula():
    ops = OPS(dim=3, dataset_size=10, epsilon=0.5, radius=4.0)
    B = math.log(1 + math.exp(4.0))
    assert ops.log_lik_bound == pytest.approx(B)
    assert ops.rho == pytest.approx(0.5 / (4 * B))
    assert ops.epsilon_spent == pytest.approx(0.5)
    assert ops.event() == PureDpEvent(ops.epsilon_spent)
    # eps above 4B: no tempering, and the guarantee is 4B (Theorem 1), not the larger target
    loose = OPS(dim=3, dataset_size=10, epsilon=100.0, radius=1.0)
    assert loose.rho == 1.0 and loose.epsilon_spent == pytest.approx(4 * math.log(1 + math.e))


def test_clipping_bounds_the_log_likelihood_by_B():
    ops = OPS(dim=4, dataset_size=10, epsilon=1.0, radius=2.5)
    rng = np.random.default_rng(0)
    recs = [{"x": (rng.normal(size=4) * 50).tolist(), "y": int(rng.random() < 0.5)} for _ in range(300)]
    rows = ops.parse_batch(recs).rows
    assert np.all(np.linalg.norm(rows["x"], axis=1) <= 1 + 1e-12)
    theta = rng.normal(size=(300, 4))
    theta *= 2.5 / np.linalg.norm(theta, axis=1, keepdims=True)  # on the sphere: the worst case
    t = 2 * rows["y"] - 1
    nll = -log_expit(t * np.einsum("nd,nd->n", rows["x"], theta))
    assert nll.max() <= ops.log_lik_bound + 1e-12 and nll.max() > 0.9 * ops.log_lik_bound
    # the target vanishes off the ball
    assert ops.log_target(np.array([3.0, 0, 0, 0]), rows["x"], t)[0] == -np.inf


def test_tempered_posterior_privacy_loss_is_at_most_epsilon():
    """Exact densities on a 1-D grid: worst log ratio over neighbouring data sets <= eps."""
    eps, R = 0.8, 3.0
    ops = OPS(dim=1, dataset_size=6, epsilon=eps, radius=R)
    grid = np.linspace(-R, R, 4001)[:, None]
    X = np.array([[0.3], [-0.9], [1.0], [0.5], [-0.2], [0.7]])
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])

    def log_density(X, y, rho_override=None):
        lt = ops.log_target(grid, X, 2 * y - 1)
        if rho_override is not None:  # the same posterior at another temperature
            lt = lt / ops.rho * rho_override
        return lt - logsumexp(lt)

    worst = worst_untempered = 0.0
    base = log_density(X, y)
    base1 = log_density(X, y, rho_override=1.0)
    for x_new, y_new in [([1.0], 0.0), ([-1.0], 1.0), ([1.0], 1.0), ([-1.0], 0.0)]:
        X2, y2 = X.copy(), y.copy()
        X2[2], y2[2] = x_new, y_new  # replace one record
        worst = max(worst, np.abs(log_density(X2, y2) - base).max())
        worst_untempered = max(worst_untempered, np.abs(log_density(X2, y2, rho_override=1.0) - base1).max())
    assert worst <= eps
    assert worst_untempered > eps  # without the scaling the same release would exceed the target


def filled(ops, X, y):
    res = Reservoir(ops.row_layout(), len(y), np.random.default_rng(0))
    res.add_batch(ops.parse_batch([{"x": x.tolist(), "y": int(t)} for x, t in zip(X, y)]).rows)
    return res


def test_release_passes_budget_and_ledger_then_halts():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 2))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (X @ np.array([2.0, -1.0]) > 0).astype(float)
    ops = OPS(dim=2, dataset_size=400, epsilon=1.0, radius=4.0, mcmc_steps=600)
    monitor = BudgetMonitor(1.5, 1e-5, PldAccountant(), MemoryLedger())
    empty = Reservoir(ops.row_layout(), 400, np.random.default_rng(0))
    with pytest.raises(ReservoirNotFull):
        ops.release(empty, monitor, rng)
    res = filled(ops, X, y)
    assert ops.release(res, monitor, np.random.default_rng(2)) == 0
    assert monitor.ledger.events() == [PureDpEvent(1.0)]
    released = ops.theta.copy()
    assert np.linalg.norm(released) <= 4.0 and np.any(released != 0)
    assert np.mean((ops.predict_proba(X) > 0.5) == (y == 1)) > 0.8
    assert ops.release(res, monitor, np.random.default_rng(3)) is None  # 2 eps > 1.5: refused
    assert monitor.halted and len(monitor.ledger.events()) == 1
    np.testing.assert_array_equal(ops.theta, released)  # nothing new was released


def test_engine_refuses_ops_at_construction():
    ops = OPS(dim=2, dataset_size=10, epsilon=1.0)
    res = Reservoir(ops.row_layout(), 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="one posterior sample"):
        PrivateEngine(ops, res, FixedSizeSampler(5), BudgetMonitor(1.0, 1e-5, PldAccountant(), MemoryLedger()),
                      1.0, np.random.default_rng(0), tau0=1.0, kappa=0.7, accountant_name="pld")
