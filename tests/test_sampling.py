"""Samplers: exact fixed-size batches, Binomial(M, q) Poisson batches, public normalisers."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from stream_vips.core.data.sampling import FixedSizeSampler, PoissonSampler, make_sampler
from stream_vips.errors import ReservoirNotFull


def test_fixed_size_batches_have_exactly_s_distinct_members():
    sampler = FixedSizeSampler(25)
    rng = np.random.default_rng(0)
    counts = np.zeros(100)
    for _ in range(2000):
        idx = sampler.sample(100, rng, capacity=100)
        assert idx.size == 25 and np.unique(idx).size == 25
        assert idx.min() >= 0 and idx.max() < 100
        counts[idx] += 1
    # independent draws each step: every slot is used at rate S/M (chi-square, p > 0.001;
    # same covariance argument as the reservoir test: X ~ chi2(M-1) after the (M-1)/(M(1-q)) factor)
    q, runs, m = 0.25, 2000, 100
    x2 = np.sum((counts - runs * q) ** 2) * (m - 1) / (runs * q * (1 - q) * m)
    assert stats.chi2.sf(x2, m - 1) > 1e-3


def test_poisson_batch_sizes_follow_binomial():
    """Chi-square goodness of fit of 3000 batch sizes to Binomial(M, q), bins with expected >= 5."""
    m, q, runs = 200, 0.1, 3000
    sampler = PoissonSampler(q)
    rng = np.random.default_rng(42)
    sizes = np.array([sampler.sample(m, rng, capacity=m).size for _ in range(runs)])
    lo, hi = int(stats.binom.ppf(0.005, m, q)), int(stats.binom.ppf(0.995, m, q))
    edges = np.arange(lo, hi + 2)
    observed = np.array(
        [np.sum(sizes < lo)] + [np.sum(sizes == k) for k in edges[:-1]] + [np.sum(sizes > hi)]
    )
    probs = np.concatenate(
        [[stats.binom.cdf(lo - 1, m, q)], stats.binom.pmf(edges[:-1], m, q), [stats.binom.sf(hi, m, q)]]
    )
    expected = runs * probs
    assert expected.min() >= 5
    x2 = np.sum((observed - expected) ** 2 / expected)
    assert stats.chi2.sf(x2, observed.size - 1) > 1e-3
    # sizes vary, so a size-dependent normaliser would differ from the constant one
    assert sizes.std() > 1


def test_normaliser_is_the_public_constant():
    m = 1000
    poisson = PoissonSampler(0.05)
    fixed = FixedSizeSampler(50)
    rng = np.random.default_rng(1)
    realised = {poisson.sample(m, rng, capacity=m).size for _ in range(20)}
    assert len(realised) > 1
    assert poisson.normaliser(m) == pytest.approx(0.05 * m)
    assert poisson.rate(m) == 0.05
    assert fixed.normaliser(m) == 50.0 and fixed.rate(m) == 0.05
    assert (poisson.name, fixed.name) == ("poisson", "fixed")


def test_refuses_before_reservoir_full():
    for sampler in (PoissonSampler(0.5), FixedSizeSampler(3)):
        with pytest.raises(ReservoirNotFull, match="9 of 10"):
            sampler.sample(9, np.random.default_rng(0), capacity=10)


def test_validation_and_factory():
    with pytest.raises(ValueError, match="rate"):
        PoissonSampler(0.0)
    with pytest.raises(ValueError, match="rate"):
        PoissonSampler(1.5)
    with pytest.raises(ValueError, match="batch_size"):
        FixedSizeSampler(0)
    with pytest.raises(ValueError, match="exceeds"):
        FixedSizeSampler(11).sample(10, np.random.default_rng(0), capacity=10)
    s = make_sampler("poisson", 100, 1000)
    assert isinstance(s, PoissonSampler) and s.q == 0.1
    assert isinstance(make_sampler("fixed", 100, 1000), FixedSizeSampler)
    with pytest.raises(ValueError, match="method"):
        make_sampler("shuffle", 10, 100)
    with pytest.raises(ValueError, match="exceeds"):
        make_sampler("fixed", 200, 100)
    with pytest.raises(ValueError, match="batch_size"):
        make_sampler("poisson", 200, 100)


def test_every_boundary_value_of_the_sampling_configuration():
    """Inclusive where the rules allow it (S = M, q = 1, a reservoir of one), refused just outside."""
    rng = np.random.default_rng(0)
    assert FixedSizeSampler(1).sample(1, rng, capacity=1).tolist() == [0]
    assert PoissonSampler(1.0).sample(1, rng, capacity=1).tolist() == [0]
    assert FixedSizeSampler(5).rate(5) == 1.0 and FixedSizeSampler(5).normaliser(5) == 5.0
    assert make_sampler("poisson", 5, 5).q == 1.0 and make_sampler("poisson", 1, 5).q == 0.2
    for bad in (0, -1, True, 2.5, 6):
        with pytest.raises(ValueError, match="batch_size"):
            make_sampler("poisson", bad, 5)
        with pytest.raises(ValueError, match="batch_size"):
            make_sampler("fixed", bad, 5)
    with pytest.raises(ValueError, match="capacity must be positive"):
        FixedSizeSampler(1).sample(0, rng, capacity=0)
