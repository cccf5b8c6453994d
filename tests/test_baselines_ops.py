"""OPS baseline: scaled likelihood for the target epsilon, clipping bound, and an uncertified release
that every plain accountant refuses (only the explicit AssumeExactSampling opt-in releases)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import log_expit, logsumexp

from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import FixedSizeSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.errors import ReservoirNotFull
from stream_vips.models.baselines.ops import OPS, UNCERTIFIED_REASON, AssumeExactSampling
from stream_vips.privacy.accountants import PldAccountant, RdpAccountant, StrongCompositionAccountant, UnsupportedEvent
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import PureDpEvent, UncertifiedEvent, event_from_dict
from stream_vips.privacy.ledger import MemoryLedger


def test_scaled_likelihood_matches_the_target_epsilon_formula():
    ops = OPS(dim=3, dataset_size=10, epsilon=0.5, radius=4.0)
    B = math.log(1 + math.exp(4.0))
    assert ops.log_lik_bound == pytest.approx(B)
    assert ops.rho == pytest.approx(0.5 / (4 * B))
    assert ops.nominal_epsilon == pytest.approx(0.5)
    # the chain is not an exact sample: the ledger event is uncertified, with the nominal epsilon
    assert ops.event() == UncertifiedEvent("ops", ops.nominal_epsilon, UNCERTIFIED_REASON)
    assert not ops.event().certified and "exact sample" in ops.event().reason
    # eps above 4B: no tempering, and the nominal guarantee is 4B (Theorem 1), not the larger target
    loose = OPS(dim=3, dataset_size=10, epsilon=100.0, radius=1.0)
    assert loose.rho == 1.0 and loose.nominal_epsilon == pytest.approx(4 * math.log(1 + math.e))


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


def separable(n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(n, 2))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X, (X @ np.array([2.0, -1.0]) > 0).astype(float)


@pytest.mark.parametrize("accountant", [PldAccountant(), RdpAccountant(), StrongCompositionAccountant(PldAccountant())],
                         ids=["pld", "rdp", "strong"])
def test_plain_accountants_refuse_the_uncertified_release(accountant):
    X, y = separable()
    ops = OPS(dim=2, dataset_size=400, epsilon=1.0, radius=4.0, mcmc_steps=50)
    monitor = BudgetMonitor(10.0, 1e-5, accountant, MemoryLedger())
    with pytest.raises(UnsupportedEvent, match="uncertified|UncertifiedEvent"):
        ops.release(filled(ops, X, y), monitor, np.random.default_rng(2))
    # a configuration error, not a budget decision: nothing appended, nothing sampled
    assert monitor.ledger.events() == [] and not monitor.halted
    np.testing.assert_array_equal(ops.theta, np.zeros(2))


def test_a_ledger_written_under_the_opt_in_is_refused_on_replay():
    X, y = separable()
    ops = OPS(dim=2, dataset_size=400, epsilon=1.0, radius=4.0, mcmc_steps=50)
    ledger = MemoryLedger()
    assert ops.release(filled(ops, X, y), BudgetMonitor(2.0, 1e-5, AssumeExactSampling(PldAccountant()), ledger),
                       np.random.default_rng(2)) == 0
    stored = ledger.events()
    assert stored == [ops.event()] and event_from_dict(stored[0].to_dict()) == stored[0]
    with pytest.raises(UnsupportedEvent):
        BudgetMonitor(2.0, 1e-5, PldAccountant(), ledger)  # a restart without the opt-in
    # the opt-in accounts exactly the pure-DP event Theorem 1 would give an exact sample
    assert BudgetMonitor(2.0, 1e-5, AssumeExactSampling(PldAccountant()), ledger).spent() == \
        PldAccountant().epsilon([PureDpEvent(ops.nominal_epsilon)], 1e-5)


def test_hostile_labels_are_mapped_to_plus_minus_one_behind_the_wall():
    """Whatever y the reservoir holds, t is +-1, so |log p| <= B: the chain equals the one on mapped labels."""
    X, _ = separable(6)
    ops = OPS(dim=2, dataset_size=6, epsilon=1.0, radius=4.0, mcmc_steps=200)
    hostile = np.array([7.0, -3.0, np.nan, 0.7, 1.0, 0.0])
    mapped = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    a = ops.sample(X, hostile, np.random.default_rng(5))
    b = ops.sample(X, mapped, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)


def test_release_under_the_explicit_opt_in_passes_budget_and_ledger_then_halts():
    X, y = separable()
    rng = np.random.default_rng(1)
    ops = OPS(dim=2, dataset_size=400, epsilon=1.0, radius=4.0, mcmc_steps=600)
    monitor = BudgetMonitor(1.5, 1e-5, AssumeExactSampling(PldAccountant()), MemoryLedger())
    empty = Reservoir(ops.row_layout(), 400, np.random.default_rng(0))
    with pytest.raises(ReservoirNotFull):
        ops.release(empty, monitor, rng)
    res = filled(ops, X, y)
    assert ops.release(res, monitor, np.random.default_rng(2)) == 0
    assert monitor.ledger.events() == [UncertifiedEvent("ops", 1.0, UNCERTIFIED_REASON)]
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
