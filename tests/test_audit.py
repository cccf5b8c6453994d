"""Empirical privacy audit of every registered family through the real engine (issue 19).

Each family's neighbouring pair is released many times per side by ``PrivateEngine.step()``; a
threshold test chosen on training releases gives an epsilon lower bound, with exact binomial
confidence bounds, on separate test releases. The test fails when the lower bound exceeds the
accountant's claim for that release: a 95%-confidence proof that the release is less private
than the ledger says. A family whose declared bounds are half the true ones must be caught, and
so must the key-unit audits without their per-key clip and linreg's out-of-bound candidates
with its clipping switched off (each control puts the bug back by monkeypatching). Without noise,
every audited pair must come within its stated floor of the claimed sensitivity and no pair of
candidates may exceed it, so a claimed diameter cut below the floor fails at once.

Sizes: 3,000 training and 12,000 test releases per side (about a minute and a half on 2 cores,
most of it LDA's E-step). At q = 1 and the claimed sensitivity 2/3 in noise units (z = 3) a
correct family's bound is near 0.7 of its claim, and a 2x sensitivity pushes it to about 1.5x.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats
from scipy.optimize import brentq

from stream_vips.audit.families import (
    AUDIT_DELTA,
    EXTRA_AUDITS,
    FAMILY_AUDITS,
    KEY_RECORDS,
    NOT_AUDITED,
    audit_family,
    broken_audit,
    candidate_distances,
    pair_sensitivity,
)
from stream_vips.audit.release import EngineTrials, claimed_epsilon
from stream_vips.audit.spec import trials
from stream_vips.audit.stats import (
    audit_samples,
    clopper_pearson_upper,
    epsilon_lower_bound,
    ideal_lower_bound,
)
from stream_vips.models import MODEL_FAMILIES
from stream_vips.models import linreg as linreg_module
from stream_vips.models.linreg import LinearRegression
from stream_vips.models.logistic import BayesianLogisticRegression
from stream_vips.models.sbn import AUDIT_PIXELS

N_TRAIN, N_TEST, SEED = 3_000, 12_000, 19
ALL_AUDITS = {**FAMILY_AUDITS, **EXTRA_AUDITS}


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon(delta) of a Gaussian shift mu (noise units), an independent reference:
    delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) (Balle & Wang 2018, Thm 8)."""
    f = lambda e: stats.norm.cdf(mu / 2 - e / mu) - math.exp(e) * stats.norm.cdf(-mu / 2 - e / mu) - delta  # noqa: E731
    return brentq(f, 0.0, 100.0, xtol=1e-12)


# --------------------------------------------------------------------------- the statistics

def test_clopper_pearson_upper_is_exact_at_zero_and_covers():
    # k = 0: the bound solves (1 - p)^n = alpha exactly
    assert clopper_pearson_upper(0, 500, 0.025) == pytest.approx(1 - 0.025 ** (1 / 500), rel=1e-9)
    assert clopper_pearson_upper(500, 500, 0.025) == 1.0
    # coverage: P[p <= upper(K)] >= 1 - alpha for K ~ Binomial(n, p), computed exactly
    n, alpha = 200, 0.025
    upper = clopper_pearson_upper(np.arange(n + 1), n, alpha)
    for p in (0.001, 0.02, 0.3, 0.9):
        assert stats.binom.pmf(np.arange(n + 1), n, p)[upper >= p].sum() >= 1 - alpha


def test_lower_bound_never_exceeds_the_true_epsilon_of_randomized_response():
    """Randomized response is exactly eps-DP with delta = 0: the best test's bound stays below eps
    in (at least) 95% of repetitions, and here in every one of 20 seeded repetitions."""
    eps, n = 1.5, 20_000
    p = math.exp(eps) / (1 + math.exp(eps))  # P[output = true bit]
    rng = np.random.default_rng(0)
    bounds = []
    for _ in range(20):
        fp = rng.binomial(n, 1 - p)  # side 0 says 1
        fn = rng.binomial(n, 1 - p)  # side 1 says 0
        bounds.append(epsilon_lower_bound(fp, n, fn, n, delta=0.0))
    assert max(bounds) <= eps
    assert min(bounds) > eps - 0.15  # and it is tight: the CP margin at ~4,000 errors is ~0.05


def test_audit_of_an_exact_gaussian_is_sound_and_tight():
    """Synthetic releases with a known mechanism: N(0, I) vs N(mu e1, I) is exactly the analytic
    Gaussian; the audit's bound lies below it and near the ideal test's."""
    mu, delta = 1.0, AUDIT_DELTA
    rng = np.random.default_rng(1)
    shift = np.zeros(4)
    shift[0] = mu
    draw = lambda n, m: rng.standard_normal((n, 4)) + m  # noqa: E731
    res = audit_samples(draw(N_TRAIN, 0), draw(N_TRAIN, shift), draw(N_TEST, 0), draw(N_TEST, shift),
                        delta, gaussian_epsilon(mu, delta))
    assert not res.violated
    assert res.epsilon_lower_bound >= 0.8 * ideal_lower_bound(mu, N_TEST, delta)


def test_identical_sides_show_nothing():
    rng = np.random.default_rng(2)
    draw = lambda n: rng.standard_normal((n, 3))  # noqa: E731
    res = audit_samples(draw(2000), draw(2000), draw(8000), draw(8000), AUDIT_DELTA, 1.0)
    assert res.epsilon_lower_bound < 0.2


# --------------------------------------------------------------------------- the engine path

def test_every_registered_family_is_audited_or_excluded_with_a_reason():
    assert set(FAMILY_AUDITS) | set(NOT_AUDITED) == set(MODEL_FAMILIES)
    assert not set(FAMILY_AUDITS) & set(NOT_AUDITED)
    assert all(reason.strip() for reason in NOT_AUDITED.values())


def test_engine_trials_release_the_normalised_noisy_sum():
    """The recorded statistic is the engine's: the clipped sum of the one record over the public
    normaliser, plus noise of the engine's block std over the normaliser; the ledger grows."""
    spec = FAMILY_AUDITS["linreg"]
    record = {"x": [0.25, 0.0], "y": 2.0}
    side = EngineTrials(spec.make_model, record, capacity=4, sampling="fixed", batch_size=4,
                        noise_multiplier=3.0, seed=5)
    out = side(4000)
    # coordinates: xx upper triangle (3), xy (2); xy[0] = x0 * y / S = 0.25 * 2 / 4
    std = side.engine.block_stds["xy"] / 4
    assert out.shape == (4000, 5)
    assert abs(out[:, 3].mean() - 0.125) < 4 * std / math.sqrt(4000)
    assert out[:, 3].std() == pytest.approx(std, rel=0.05)
    assert side.monitor.steps == 4000
    # the claim is the exact Gaussian epsilon of sensitivity 2C / (z C) = 2/3 at q = 1
    assert claimed_epsilon(side.event, AUDIT_DELTA) == pytest.approx(gaussian_epsilon(2 / 3, AUDIT_DELTA), rel=1e-4)


@pytest.mark.parametrize("name", sorted(ALL_AUDITS))
def test_family_audit_stays_below_the_claim(name):
    spec = ALL_AUDITS[name]
    result = audit_family(spec, n_train=N_TRAIN, n_test=N_TEST, seed=SEED, name=name)
    r = result.result
    assert r.epsilon_lower_bound <= r.claimed_epsilon, (
        f"{name}: empirical epsilon >= {r.epsilon_lower_bound:.3f} at delta {r.delta:g} exceeds the claimed "
        f"{r.claimed_epsilon:.3f} (fp {r.false_positives}, fn {r.false_negatives} of {r.n_test})")
    # not vacuous: the test sees the pair at least half as well as a perfect test would
    assert r.epsilon_lower_bound >= 0.5 * result.ideal_lower_bound, result.to_dict()
    # noiseless: the clipped contributions stay within the diameter the accountant is told
    assert result.pair.ratio <= 1 + 1e-9, result.to_dict()


@pytest.mark.parametrize("name", sorted(ALL_AUDITS))
def test_the_pair_reaches_its_floor_and_no_candidate_pair_exceeds_the_claim(name):
    """Noiseless, every audit: the audited pair moves the release by at least ``ratio_floor`` of
    the claimed sensitivity, and no pair of candidates by more than all of it (the claim is an
    upper bound). Together they catch a claimed diameter cut to any factor below the floor; the
    floors exceed 0.6, and 0.8 except for linreg, whose mechanism stops at 0.75 (its note)."""
    spec = ALL_AUDITS[name]
    assert spec.floor_reason.strip() and spec.ratio_floor <= 1
    assert spec.ratio_floor > (0.6 if spec.family == "linreg" else 0.8), spec.ratio_floor
    assert pair_sensitivity(spec).ratio >= spec.ratio_floor, (name, pair_sensitivity(spec))
    distances, claimed = candidate_distances(spec)
    assert distances.max() <= claimed * (1 + 1e-9), (name, distances.max() / claimed)


def test_sbn_pair_is_the_farthest_among_random_images_and_within_the_claim():
    """sbn's claim sqrt(2) is a proof's upper bound that no image attains; at the audit's state,
    200 random images (pixel densities uniform in [0, 1], seed 0) neither exceed it nor beat the
    chosen pair, so the floor is not an artefact of a short candidate list."""
    spec = FAMILY_AUDITS["sbn"]
    pair = pair_sensitivity(spec)
    rng = np.random.default_rng(0)
    images = (rng.random((200, AUDIT_PIXELS)) < rng.random((200, 1))).astype(int)
    distances, claimed = candidate_distances(replace(spec, candidates=tuple({"y": y.tolist()} for y in images)))
    assert distances.max() <= pair.sensitivity * (1 + 1e-9) < claimed, (distances.max() / claimed, pair.ratio)


@pytest.mark.parametrize("name", sorted(FAMILY_AUDITS))
def test_a_claimed_diameter_cut_below_the_floor_is_seen_without_noise(name, monkeypatch):
    """The floor's purpose, checked: with the model's diameter cut to 0.8x (0.6x for linreg) the
    engine claims less than the candidates move the release, which the noiseless check reports."""
    spec = FAMILY_AUDITS[name]
    cut = 0.6 if spec.family == "linreg" else 0.8
    model_class = type(spec.make_model(spec.capacity))
    true_diameter = model_class.diameter
    monkeypatch.setattr(model_class, "diameter", lambda self, weights=None: cut * true_diameter(self, weights))
    distances, claimed = candidate_distances(spec)
    assert distances.max() > claimed * (1 + 1e-9), (name, distances.max() / claimed)


@pytest.mark.parametrize("name", ["linreg", "dpvi"])
def test_a_family_with_half_its_true_bounds_is_caught(name):
    """Declared bounds at half the true ones (noise calibrated to half the sensitivity): the
    audit must prove the claim false, for a multi-block (linreg) and a one-block (dpvi) family."""
    spec = broken_audit(FAMILY_AUDITS[name])
    assert pair_sensitivity(spec).ratio == pytest.approx(2 * pair_sensitivity(FAMILY_AUDITS[name]).ratio, rel=1e-6)
    r = audit_family(spec, n_train=N_TRAIN, n_test=N_TEST, seed=SEED).result
    assert r.violated, r.to_dict()


# --------------------------------------------------------------------------- privacy.unit: key

def test_key_audits_release_one_key_of_several_records_through_the_key_engine():
    """The key-unit audits run the key path: a KeyReservoir whose slot 0 holds the audited key's
    KEY_RECORDS records (the other slots hold null records), an engine with unit "key" and the
    claim for the key-level event."""
    spec = EXTRA_AUDITS["linreg_key"]
    pair = pair_sensitivity(spec)
    side = trials(spec, pair.record_a, seed=3)
    assert side.engine.unit == "key" and side.event == trials(spec, pair.record_b, seed=4).event
    _, groups, n_groups = side.reservoir.take_groups(np.arange(4))  # the engine's view at q = 1
    assert np.bincount(groups, minlength=n_groups).tolist() == [KEY_RECORDS, 0, 0, 0]
    assert side.engine.privacy_report(0, False)["unit"] == "key"


@pytest.mark.parametrize("name, model_class", [("linreg_key", LinearRegression),
                                               ("logistic_key", BayesianLogisticRegression)])
def test_a_key_audit_without_the_per_key_clip_is_caught(name, model_class, monkeypatch):
    """The control of the key-unit audits: with the per-key clip removed (each record clipped,
    a key's records summed unscaled) one key moves the release by up to KEY_RECORDS times the
    bound the accountant is told, and the same audit must prove the claim false."""
    monkeypatch.setattr(model_class, "group_clipped_sum",
                        lambda self, batch, groups, n_groups: self.clipped_sum(batch))
    r = audit_family(EXTRA_AUDITS[name], n_train=N_TRAIN, n_test=N_TEST, seed=SEED).result
    assert r.violated, r.to_dict()


def test_linreg_with_clipping_switched_off_is_caught(monkeypatch):
    """The control of the out-of-bound candidates: with linreg's feature clipping switched off
    (clip_rows the identity, at parse time and behind the wall) a record x = [100, 0] contributes
    ||x y|| = 200 against the declared R B = 0.5. The pair ratio, measured against the declared
    bounds, leaves [0, 1] and the audit proves the claim false."""
    monkeypatch.setattr(linreg_module, "clip_rows", lambda X, bound: np.asarray(X, dtype=float))
    result = audit_family(EXTRA_AUDITS["linreg_out_of_bounds"], n_train=N_TRAIN, n_test=N_TEST, seed=SEED)
    assert result.pair.ratio > 100, result.to_dict()
    assert result.result.violated, result.to_dict()


def _loosened_clip(monkeypatch, factor: float, lower: bool = True, upper: bool = True) -> None:
    """Patch the centred residual's clip to ``factor`` C_r on the chosen sides (inf: no clip)."""
    residual = BayesianLogisticRegression._residual

    def patched(self, kappa, omega, xm):
        clip = self.residual_clip
        monkeypatch.setattr(self, "residual_clip", np.inf)
        r = residual(self, kappa, omega, xm)
        monkeypatch.setattr(self, "residual_clip", clip)
        return np.clip(r, -factor * clip if lower else -np.inf, factor * clip if upper else np.inf)

    monkeypatch.setattr(BayesianLogisticRegression, "_residual", patched)


def test_the_centred_release_without_its_residual_clip_is_caught(monkeypatch):
    """The control of the centred audit: with the residual clip switched off, the record the
    iterate misclassifies far out has residual near +-1, twice C_r, so the pair moves the release
    by 1.79 times the claim (noiseless) and the audit proves the claim false."""
    spec = EXTRA_AUDITS["logistic_centred"]
    assert pair_sensitivity(spec).ratio <= 1 + 1e-9
    _loosened_clip(monkeypatch, np.inf)
    result = audit_family(spec, n_train=N_TRAIN, n_test=N_TEST, seed=SEED)
    assert result.pair.ratio > 1.7, result.to_dict()
    assert result.result.violated, result.to_dict()


@pytest.mark.parametrize("factor, lower, upper", [(1.02, True, True), (1.0, False, True), (1.0, True, False)])
def test_a_loose_or_one_sided_centred_clip_is_seen_without_noise(monkeypatch, factor, lower, upper):
    """The centred audit's pair sits at 0.999 of the claim and depends on the clip on both sides
    (one pair per label), so a clip 2% too loose or missing on either side moves some pair past
    the claim, which the noiseless check reports."""
    spec = EXTRA_AUDITS["logistic_centred"]
    _loosened_clip(monkeypatch, factor, lower, upper)
    distances, claimed = candidate_distances(spec)
    assert distances.max() > claimed * (1 + 1e-9), distances.max() / claimed


def test_the_fit_audits_use_the_allocations_fit_deploys():
    """logistic_fit and logistic_centred audit the noise allocations stream_vips.fitting uses
    (read from its constants), not only the family's default: their engines calibrate the
    diameter and the per-block noise to those weights (at g:s2 = 1:1 the stds are in the ratio of
    the bounds, 1/2 : 1/4)."""
    for name in ("logistic_fit", "logistic_centred"):
        spec = EXTRA_AUDITS[name]
        engine = trials(spec, None, seed=0).engine
        assert engine.diameter == pytest.approx(spec.make_model(spec.capacity).diameter(spec.block_weights))
        assert engine.diameter < trials(FAMILY_AUDITS["logistic"], None, seed=0).engine.diameter
    assert trials(EXTRA_AUDITS["logistic_centred"], None, seed=0).engine.block_stds["g"] == pytest.approx(
        trials(EXTRA_AUDITS["logistic_centred"], None, seed=0).engine.block_stds["s2"] * 0.5 / 0.25)
