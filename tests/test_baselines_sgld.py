"""DP-SGLD baseline: the paper's privacy condition is checked or the model refuses to run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import FixedSizeSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.baselines.sgld import DPSGLD, SgldConditionError
from stream_vips.privacy.accountants import RdpAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.ledger import MemoryLedger

PARAMS = dict(dim=3, dataset_size=2000, batch_size=100, step_size=1e-4, epsilon=1.0, delta=1e-5, passes=1.0)


def test_variance_and_implied_noise_multiplier_match_algorithm_2():
    m = DPSGLD(**PARAMS)
    N, T, tau, eps, delta, eta = 2000, 1.0, 100, 1.0, 1e-5, 1e-4
    v = 128 * N * T / (tau * eps**2) * math.log(2.5 * N * T / (tau * delta)) * math.log(2 / delta) * eta**2
    assert v > eta and m.paper_variance() == pytest.approx(v)
    # z = sqrt(v) tau / (eta N L) = sqrt(128 T tau log(..) log(..) / N) / eps, independent of eta
    z = math.sqrt(128 * T * tau * math.log(2.5 * N * T / (tau * delta)) * math.log(2 / delta) / N) / eps
    assert m.paper_noise_multiplier() == pytest.approx(z)
    assert m.implied_variance(z) == pytest.approx(v)
    assert m.iterations == 20
    # a tiny step makes the Langevin term eta win (the privacy term shrinks as eta^2):
    # z = tau / (N L sqrt(eta))
    tiny = DPSGLD(**{**PARAMS, "step_size": 1e-12})
    assert tiny.paper_variance() == 1e-12
    assert tiny.paper_noise_multiplier() == pytest.approx(100 / (2000 * math.sqrt(1e-12)))


def test_refuses_passes_below_theorem_4():
    need = 4.0**2 * 2000 / (32 * 10 * math.log(2 / 1e-5))
    assert need > 1
    with pytest.raises(SgldConditionError, match=r"Theorem 4.*passes T = 1 <"):
        DPSGLD(**{**PARAMS, "epsilon": 4.0, "batch_size": 10})
    assert DPSGLD(**{**PARAMS, "epsilon": 4.0, "batch_size": 10, "passes": need}).min_passes() == pytest.approx(need)


def test_refuses_engine_noise_below_the_paper_variance():
    m = DPSGLD(**PARAMS)
    z = m.paper_noise_multiplier()
    m.check_noise_multiplier(z)
    m.check_noise_multiplier(2 * z)
    with pytest.raises(SgldConditionError, match="Algorithm 2"):
        m.check_noise_multiplier(0.99 * z)


def test_runs_through_the_engine_clipped_and_accounted():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (X @ np.array([3.0, -2.0, 0.0]) + 0.3 * rng.normal(size=2000) > 0).astype(float)
    m = DPSGLD(**{**PARAMS, "step_size": 2e-4, "lipschitz": 0.5, "passes": 20.0, "burn_in": 100})
    res = Reservoir(m.row_layout(), 2000, np.random.default_rng(1))
    res.add_batch(m.parse_batch([{"x": x.tolist(), "y": int(t)} for x, t in zip(X, y)]).rows)
    g = m.clipped_sum({"x": X, "y": y})["grad"]
    assert np.linalg.norm(g) <= 2000 * 0.5  # each clipped per-record gradient has norm <= L
    z = m.paper_noise_multiplier()
    m.check_noise_multiplier(z)
    monitor = BudgetMonitor(1e6, 1e-5, RdpAccountant(), MemoryLedger())
    engine = PrivateEngine(m, res, FixedSizeSampler(100), monitor, z, np.random.default_rng(2),
                           tau0=1.0, kappa=0.7, accountant_name="autodp", seeded=True)
    assert engine.block_stds == {"grad": pytest.approx(z * 0.5)}
    for _ in range(m.iterations):
        assert engine.step() is not None
    assert len(monitor.ledger.events()) == m.iterations == 400
    p = m.predict_proba(X)
    assert np.mean((p > 0.5) == (y == 1)) > 0.8  # the samples carry the signal



def test_engine_refuses_a_noise_multiplier_below_algorithm_2():
    """The engine asks the model before any step, so a pipeline cannot under-noise DP-SGLD."""
    m = DPSGLD(**PARAMS)
    z = m.paper_noise_multiplier()
    res = Reservoir(m.row_layout(), 2000, np.random.default_rng(0))
    monitor = BudgetMonitor(1.0, 1e-5, RdpAccountant(), MemoryLedger())

    def make(zz: float) -> PrivateEngine:
        return PrivateEngine(m, res, FixedSizeSampler(100), monitor, zz, np.random.default_rng(0),
                             tau0=10.0, kappa=0.7, accountant_name="autodp")

    with pytest.raises(SgldConditionError, match="Algorithm 2"):
        make(0.5 * z)
    assert make(z).noise_multiplier == z
