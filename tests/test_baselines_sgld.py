"""DP-SGLD baseline: the accountant's noise sets the Langevin step; the paper's noise is an option
whose condition is checked and whose spending the start reports."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from stream_vips import PrivateLearner
from stream_vips.config import ConfigError, config_from_dict
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import FixedSizeSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.baselines.sgld import DPSGLD, PaperNoise, SgldConditionError, stable_step
from stream_vips.privacy.accountants import RdpAccountant, make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import MemoryLedger

PAPER = dict(dataset_size=2000, batch=100, passes=1.0, epsilon=1.0, delta=1e-5, step_size=1e-4)
LEARNER = dict(dim=3, epsilon=1.0, delta=1e-5, reservoir=2000, batch_size=100, every_records=20,
               planned_steps=50, seed=0)


def _data(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = (X @ np.array([3.0, -2.0, 0.0]) + 0.3 * rng.normal(size=n) > 0).astype(float)
    return X, y


def test_paper_variance_and_noise_multiplier_match_algorithm_2():
    p = PaperNoise(**PAPER)
    N, T, tau, eps, delta, eta = 2000, 1.0, 100, 1.0, 1e-5, 1e-4
    v = 128 * N * T / (tau * eps**2) * math.log(2.5 * N * T / (tau * delta)) * math.log(2 / delta) * eta**2
    assert v > eta and p.variance() == pytest.approx(v)
    # z = sqrt(v) tau / (eta N L) = sqrt(128 T tau log(..) log(..) / N) / eps, independent of eta
    z = math.sqrt(128 * T * tau * math.log(2.5 * N * T / (tau * delta)) * math.log(2 / delta) / N) / eps
    assert p.noise_multiplier() == pytest.approx(z) == p.privacy_branch_multiplier()
    assert p.iterations == 20
    # a tiny step makes the Langevin term eta win (the privacy term shrinks as eta^2): z = tau / (N L sqrt(eta))
    tiny = PaperNoise(**{**PAPER, "step_size": 1e-12})
    assert tiny.variance() == 1e-12
    assert tiny.noise_multiplier() == pytest.approx(100 / (2000 * math.sqrt(1e-12)))


def test_refuses_passes_below_theorem_4():
    need = 4.0**2 * 2000 / (32 * 10 * math.log(2 / 1e-5))
    assert need > 1
    with pytest.raises(SgldConditionError, match=r"Theorem 4.*passes T = 1 <"):
        PaperNoise(**{**PAPER, "epsilon": 4.0, "batch": 10}).check()
    PaperNoise(**{**PAPER, "epsilon": 4.0, "batch": 10, "passes": need}).check()


def test_the_learner_builds_sgld_with_the_budget_and_batch_as_learner_options():
    """The issue's call: batch_size, epsilon and delta are the learner's; the accountant calibrates z
    and the step is the Langevin step of that noise, eta = 1 / (N s)^2 with s = z L / tau."""
    with PrivateLearner("sgld", **LEARNER) as lrn:
        m, z = lrn.model, lrn.engine.noise_multiplier
        assert isinstance(m, DPSGLD) and m.dataset_size == 2000 and m.paper is None
        assert lrn.engine.q == pytest.approx(100 / 2000)
        eta = (100 / (2000 * z)) ** 2
        assert eta < stable_step(2000, 1.0)
        assert m.langevin_step == pytest.approx(eta) and m.added_variance() == pytest.approx(0.0, abs=1e-18)
        lrn.learn_many(_data(2000 + 49 * 20))
        assert lrn.steps_taken == 50 and lrn.epsilon_spent <= 1.0
        assert lrn.epsilon_spent > 0.95  # calibrated to the budget (rtol 0.01 on z)


def test_a_stable_step_below_the_langevin_step_adds_the_missing_langevin_noise():
    """Without privacy noise (s = 0) the step is the stable one and the model adds all of the Langevin
    variance eta; with s > 0 and eta capped at the stable step it adds eta - (eta N s)^2."""
    m = DPSGLD(dim=2, dataset_size=1000, seed=0)
    m.set_noise_scale({"grad": 0.0})
    assert m.langevin_step == stable_step(1000, 1.0) and m.added_variance() == m.langevin_step
    s = 1e-4  # 1 / (N s)^2 = 100 > the stable step 1/251
    m.set_noise_scale({"grad": s})
    eta = 1.0 / 251.0
    assert m.langevin_step == pytest.approx(eta)
    assert m.added_variance() == pytest.approx(eta - (eta * 1000 * s) ** 2)
    # the update's spread from theta = 0 with a zero mean gradient is exactly that variance
    draws = []
    for seed in range(4000):
        mm = DPSGLD(dim=2, dataset_size=1000, seed=seed)
        mm.set_noise_scale({"grad": s})
        mm.update({"grad": np.zeros(2)}, rho=1.0)
        draws.append(mm.theta)
    var = np.var(np.array(draws))
    # 8000 draws: the sample variance's relative sd is sqrt(2 / 8000) = 0.016; 5 sd
    assert var == pytest.approx(m.added_variance(), rel=0.08)


def test_noise_paper_uses_algorithm_2_and_warns_what_the_accountant_certifies():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lrn = PrivateLearner("sgld", noise="paper", **LEARNER)
    m, z = lrn.model, lrn.engine.noise_multiplier
    assert m.paper is not None
    paper = PaperNoise(2000, 100.0, 50 * 100 / 2000, 1.0, 1e-5, m.paper.step_size)
    assert z == pytest.approx(paper.noise_multiplier()) == pytest.approx(paper.privacy_branch_multiplier())
    acct = make_accountant(lrn.engine.accountant_name, "poisson")
    certified = acct.epsilon([SubsampledGaussianEvent(z, 0.05, "poisson", diameter=2.0, count=50)], 1e-5)
    assert certified < 0.1  # the paper's analysis is loose: most of epsilon 1 stays unspent
    [w] = [w for w in caught if "own noise rule" in str(w.message)]
    assert f"certifies epsilon {certified:.3g} of the budget 1 for the 50 planned steps" in str(w.message)
    # the engine's noise is the paper's: the step's Langevin variance is covered, nothing added
    assert m.added_variance() == 0.0
    assert "noise: paper" in " ".join(m.summary()["notes"])
    with pytest.raises(ConfigError, match="Algorithm 2"):
        PrivateLearner("sgld", noise="paper", noise_multiplier=0.5 * z, **LEARNER)


def test_noise_paper_refuses_passes_below_theorem_4_at_start():
    with pytest.raises(ConfigError, match=r"^model\.params: sgld privacy condition \(Theorem 4\)"):
        PrivateLearner("sgld", noise="paper", **{**LEARNER, "epsilon": 50.0, "planned_steps": 1})


@pytest.mark.parametrize(("name", "value", "instead"), [
    ("batch_size", 100, "sampling.batch_size"), ("epsilon", 1.0, "privacy.epsilon"),
    ("delta", 1e-5, "privacy.delta"), ("passes", 2.0, "privacy.planned_steps")])
def test_a_configuration_with_the_old_keys_is_refused_naming_the_key_and_its_replacement(name, value, instead):
    cfg = {"model": {"family": "sgld", "params": {"dim": 3, name: value}}, "privacy": {"ledger": {"type": "memory"}}}
    with pytest.raises(ConfigError) as exc:
        PrivateLearner(config=config_from_dict(cfg, env={}))
    text = str(exc.value)
    assert text.startswith(f"model.params.{name}: the sgld family no longer takes {name}") and instead in text
    assert "\n" not in text


def test_runs_through_the_engine_clipped_and_accounted():
    X, y = _data()
    m = DPSGLD(dim=3, dataset_size=2000, lipschitz=0.5, burn_in=100, seed=0)
    res = Reservoir(m.row_layout(), 2000, np.random.default_rng(1))
    res.add_batch(m.parse_batch([{"x": x.tolist(), "y": int(t)} for x, t in zip(X, y)]).rows)
    g = m.clipped_sum({"x": X, "y": y})["grad"]
    assert np.linalg.norm(g) <= 2000 * 0.5  # each clipped per-record gradient has norm <= L
    monitor = BudgetMonitor(1e6, 1e-5, RdpAccountant(), MemoryLedger())
    engine = PrivateEngine(m, res, FixedSizeSampler(100), monitor, 3.0, np.random.default_rng(2),
                           tau0=1.0, kappa=0.7, accountant_name="autodp", seeded=True)
    assert engine.block_stds == {"grad": pytest.approx(3.0 * 0.5)}
    assert m.langevin_step == pytest.approx(min(stable_step(2000, 1.0), (100 / (2000 * 3.0 * 0.5)) ** 2))
    for _ in range(400):
        assert engine.step() is not None
    assert len(monitor.ledger.events()) == 400
    p = m.predict_proba(X)
    assert np.mean((p > 0.5) == (y == 1)) > 0.8  # the samples carry the signal


def test_fit_runs_the_accountant_noise_and_refuses_the_paper_noise_before_spending():
    """fit's sgld rule: full-batch steps at eta = 1 / z^2 for the calibrated z, the budget spent;
    noise: paper would spend a small part of it, which fit's contract does not allow."""
    from stream_vips import fit
    from stream_vips.errors import FitError

    X, y = _data(500)
    result = fit((X, y), "sgld", seed=0)
    z = result.report["budget"]["noise_multiplier"]
    assert result.report["budget"]["fraction_spent"] > 0.99
    assert result.posterior.model.noise == "accountant" and result.settings.steps == 100
    assert np.mean((result.posterior.model.predict_proba(X) > 0.5) == (y == 1)) > 0.8
    assert 1.0 / z**2 <= stable_step(500, 1.0)  # the rule's T makes the Langevin step stable
    with pytest.raises(FitError, match=r"noise: paper .* fit spends the whole budget"):
        fit((X, y), "sgld", noise="paper", seed=0)


def test_the_non_private_rule_runs_one_relaxation_time_of_the_flattest_direction():
    """At the stable step eta = 1/(N/4 + alpha) a direction of curvature alpha (the prior's, the
    least the posterior has) contracts by eta alpha per step: (N/4 + alpha) / alpha steps, bounded."""
    from stream_vips.models.baselines.sgld import RULE_MAX_STEPS, RULE_MIN_STEPS

    assert DPSGLD.fit_rule(26_049, 105, None, 1e-5, True).steps == math.ceil(26_049 / 4 + 1)
    assert DPSGLD.fit_rule(100, 5, None, 1e-5, True).steps == RULE_MIN_STEPS
    assert DPSGLD.fit_rule(10**7, 5, None, 1e-5, True).steps == RULE_MAX_STEPS
