"""Accountants: closed forms, cross-checks against autodp/dp_accounting, monotonicity, calibration."""

from __future__ import annotations

import math
import warnings

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant as DpaRdp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import binom, norm

from stream_vips.privacy.accountants import (
    Accountant,
    PldAccountant,
    RdpAccountant,
    StrongCompositionAccountant,
    UnsupportedEvent,
    make_accountant,
)
from stream_vips.privacy.calibration import calibrate_noise_multiplier
from stream_vips.privacy.events import PureDpEvent
from stream_vips.privacy.events import SubsampledGaussianEvent as E

NR = dpa.NeighboringRelation
DELTA = 1e-5
PLD = PldAccountant()
RDP = RdpAccountant()


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact epsilon of the Gaussian mechanism, sigma = noise std / sensitivity (Balle & Wang 2018):
    delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma) (the second
    term in logs, so that large epsilon does not overflow)."""
    def gap(eps):
        return (norm.cdf(0.5 / sigma - eps * sigma)
                - math.exp(eps + norm.logcdf(-0.5 / sigma - eps * sigma)) - delta)
    return brentq(gap, 0.0, 1e5, xtol=1e-12, rtol=1e-14)


def autodp_fixed(z: float, q: float, steps: int, diameter: float = 2.0) -> float:
    """Fixed-size replace-one accounting (privacy rule 3 in docs/privacy.md), written out with
    autodp's own composition and conversion."""
    from autodp.mechanism_zoo import ExactGaussianMechanism
    from autodp.transformer_zoo import AmplificationBySampling, Composition

    mech = ExactGaussianMechanism(z / diameter)
    mech.neighboring = "replace_one"
    if q < 1:
        mech = AmplificationBySampling(PoissonSampling=False)(mech, q, improved_bound_flag=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Composition()([mech], [steps]).get_approxDP(DELTA)


# --- closed forms (privacy rules 2-4) -------------------------------------------------------

@pytest.mark.parametrize("z, steps", [(1.0, 1), (2.0, 10), (5.0, 100)])
def test_pld_replace_one_at_q1_is_the_gaussian_with_sensitivity_2C(z, steps):
    eps = PLD.epsilon([E(z, 1.0, "poisson", count=steps)], DELTA)
    exact = gaussian_epsilon(z / 2 / math.sqrt(steps), DELTA)  # std zC, sensitivity 2C, T-fold
    assert exact <= eps <= exact * (1 + 1e-4) + 1e-4  # pessimistic discretization, tiny error


@pytest.mark.parametrize("z, steps", [(1.0, 1), (3.0, 1), (2.0, 10)])
def test_fixed_size_at_q1_equals_autodp_gaussian_at_sigma_z_over_2(z, steps):
    from autodp.mechanism_zoo import ExactGaussianMechanism

    eps = RDP.epsilon([E(z, 1.0, "fixed", count=steps)], DELTA)
    # T Gaussians with sigma compose to one Gaussian with sigma / sqrt(T)
    assert eps == pytest.approx(ExactGaussianMechanism(z / 2 / math.sqrt(steps)).get_approxDP(DELTA), rel=1e-9)
    assert eps == pytest.approx(gaussian_epsilon(z / 2 / math.sqrt(steps), DELTA), rel=1e-6)


def test_fixed_size_diameter_sqrt2_uses_sigma_z_over_sqrt2():
    eps = RDP.epsilon([E(2.0, 1.0, "fixed", diameter=math.sqrt(2))], DELTA)
    assert eps == pytest.approx(gaussian_epsilon(2.0 / math.sqrt(2), DELTA), rel=1e-6)
    assert eps < RDP.epsilon([E(2.0, 1.0, "fixed")], DELTA)


def test_pld_accounts_smaller_diameters_conservatively_at_2():
    a = PLD.epsilon([E(3.0, 0.1, "poisson", count=20)], DELTA)
    b = PLD.epsilon([E(3.0, 0.1, "poisson", diameter=math.sqrt(2), count=20)], DELTA)
    assert a == b


@pytest.mark.parametrize("z, q, steps", [(2.0, 0.01, 100), (1.0, 0.1, 10), (4.0, 0.05, 1000)])
def test_fixed_size_matches_autodp_rule_3_pipeline(z, q, steps):
    ours = RDP.epsilon([E(z, q, "fixed", count=steps)], DELTA)
    theirs = autodp_fixed(z, q, steps)
    assert ours == pytest.approx(theirs, rel=0.01)


# --- cross-checks and pinned conventions (dp_accounting issue 378) -------------------------

@pytest.mark.parametrize("z", [1.0, 3.0])
@pytest.mark.parametrize("M, S", [(1000, 10), (400, 100)])
@pytest.mark.parametrize("steps", [1, 300])
def test_autodp_and_dp_accounting_rdp_agree_for_fixed_size_replace_one(z, M, S, steps):
    # dp_accounting's without-replacement Gaussian reads noise_multiplier as std / (L2
    # sensitivity) = std / (2C) = z / 2 under replace-one.
    acct = DpaRdp(neighboring_relation=NR.REPLACE_ONE)
    acct.compose(dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(M, S, dpa.GaussianDpEvent(z / 2)), steps))
    ours = RDP.epsilon([E(z, S / M, "fixed", count=steps)], DELTA)
    assert ours == pytest.approx(acct.get_epsilon(DELTA), rel=0.02)


def test_pin_dp_accounting_without_replacement_reads_std_over_diameter():
    """At q = 1 the without-replacement event is the plain Gaussian on sensitivity 1 (in its
    units): noise_multiplier z/2 reproduces std zC on sensitivity 2C; passing z would report the
    epsilon of half the noise's worth of privacy (far too small)."""
    z = 2.0

    def dpa_wor(nm):
        acct = DpaRdp(neighboring_relation=NR.REPLACE_ONE)
        acct.compose(dpa.SampledWithoutReplacementDpEvent(100, 100, dpa.GaussianDpEvent(nm)))
        return acct.get_epsilon(DELTA)

    ours = RDP.epsilon([E(z, 1.0, "fixed")], DELTA)
    gauss = DpaRdp()
    gauss.compose(dpa.GaussianDpEvent(z / 2))
    assert dpa_wor(z / 2) == pytest.approx(gauss.get_epsilon(DELTA), rel=1e-9)
    assert dpa_wor(z / 2) >= ours  # RDP conversion is looser than the exact Gaussian
    assert dpa_wor(z / 2) == pytest.approx(ours, rel=0.2)
    assert dpa_wor(z) < 0.6 * ours


def test_pin_dp_accounting_pld_replace_one_reads_std_over_C():
    """PLD REPLACE_ONE's Gaussian noise_multiplier is std / C = z (its pair is +C vs -C); on the
    grid our accountant picks for the event, its epsilon is dp_accounting's."""
    z = 2.0
    h = PLD.interval({E(z, 1.0, "poisson"): 1})
    acct = PLDAccountant(NR.REPLACE_ONE, value_discretization_interval=h)
    acct.compose(dpa.PoissonSampledDpEvent(1.0, dpa.GaussianDpEvent(z)))
    assert acct.get_epsilon(DELTA) == pytest.approx(gaussian_epsilon(z / 2, DELTA), rel=1e-3)
    assert PLD.epsilon([E(z, 1.0, "poisson")], DELTA) == pytest.approx(acct.get_epsilon(DELTA), rel=1e-9)
    add_remove = PLDAccountant(NR.ADD_OR_REMOVE_ONE)
    add_remove.compose(dpa.PoissonSampledDpEvent(1.0, dpa.GaussianDpEvent(z)))
    assert add_remove.get_epsilon(DELTA) == pytest.approx(gaussian_epsilon(z, DELTA), rel=1e-3)


def test_pld_matches_dp_accounting_for_a_heterogeneous_poisson_sequence():
    seq = [E(3.0, 0.05, "poisson", count=30), E(5.0, 0.2, "poisson", count=10), E(3.0, 0.05, "poisson", count=5)]
    acct = PLDAccountant(NR.REPLACE_ONE)
    for e in seq:
        acct.compose(dpa.PoissonSampledDpEvent(e.sampling_rate, dpa.GaussianDpEvent(e.noise_multiplier)), e.count)
    assert PLD.epsilon(seq, DELTA) == pytest.approx(acct.get_epsilon(DELTA), rel=1e-3)


@pytest.mark.parametrize("z, q, steps", [(1.0, 0.01, 1000), (2.0, 0.1, 100), (1.2, 0.02, 50)])
def test_pld_is_at_most_rdp_for_poisson_add_remove(z, q, steps):
    e = E(z, q, "poisson", "add_remove", 1.0, count=steps)
    pld, rdp = PLD.epsilon([e], DELTA), RDP.epsilon([e], DELTA)
    acct = DpaRdp()
    acct.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    assert pld <= rdp and pld <= acct.get_epsilon(DELTA)
    assert rdp == pytest.approx(acct.get_epsilon(DELTA), rel=0.05)


def test_poisson_replace_one_pld_beats_fixed_size_rdp_at_equal_noise():
    # privacy rule 4 in docs/privacy.md: the default Poisson path is accounted several-fold tighter.
    z, q, steps = 1.0, 0.01, 1000
    pld = PLD.epsilon([E(z, q, "poisson", count=steps)], DELTA)
    rdp = RDP.epsilon([E(z, q, "fixed", count=steps)], DELTA)
    assert pld < rdp / 2


# --- heterogeneous sequences, grouping, unsupported events ---------------------------------

@pytest.mark.parametrize("acct, sampling", [(RDP, "fixed"), (PLD, "poisson")])
def test_epsilon_depends_on_the_multiset_of_events(acct, sampling):
    a, b = E(3.0, 0.05, sampling), E(5.0, 0.2, sampling)
    seq = [a, b, a, a.with_count(3)]
    assert acct.epsilon(seq, DELTA) == acct.epsilon([a.with_count(5), b], DELTA)
    assert acct.epsilon(seq, DELTA) > acct.epsilon([a.with_count(5)], DELTA)
    assert acct.epsilon([], DELTA) == 0.0


def test_rdp_heterogeneous_matches_autodp_composition():
    from autodp.mechanism_zoo import ExactGaussianMechanism
    from autodp.transformer_zoo import AmplificationBySampling, Composition

    mechs = []
    for z, q in [(2.0, 0.02), (4.0, 0.1)]:
        m = ExactGaussianMechanism(z / 2)
        m.neighboring = "replace_one"
        mechs.append(AmplificationBySampling(PoissonSampling=False)(m, q, improved_bound_flag=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = Composition()(mechs, [200, 50]).get_approxDP(DELTA)
    ours = RDP.epsilon([E(2.0, 0.02, "fixed", count=200), E(4.0, 0.1, "fixed", count=50)], DELTA)
    assert ours == pytest.approx(theirs, rel=0.01)


def test_unsupported_combinations_say_why():
    with pytest.raises(UnsupportedEvent, match="fixed-size .*autodp"):
        PLD.epsilon([E(1.0, 0.1, "fixed")], DELTA)
    with pytest.raises(UnsupportedEvent, match="add/remove .*pld"):
        RDP.epsilon([E(1.0, 0.1, "poisson")], DELTA)
    with pytest.raises(UnsupportedEvent, match="replace-one"):
        RDP.epsilon([E(1.0, 0.1, "fixed", "add_remove", 1.0)], DELTA)
    with pytest.raises(UnsupportedEvent, match="unknown event type"):
        RDP.epsilon([object()], DELTA)
    assert not PLD.supports(E(1.0, 0.1, "fixed")) and PLD.supports(E(1.0, 1.0, "fixed"))
    assert RDP.supports(E(1.0, 1.0, "poisson"))  # q = 1 is a plain Gaussian
    with pytest.raises(ValueError, match="delta"):
        RDP.epsilon([E(1.0, 1.0, "fixed")], 0.0)


def test_autodp_refusals_name_the_rule_and_the_accountant_to_use_instead():
    """The reason is what a user reads when a configuration is refused: it names the accountant
    whose amplification does not apply and, for Poisson replace-one, the one that does."""
    poisson = ("autodp's Poisson amplification holds for add/remove adjacency only; "
               "account Poisson replace-one steps with the pld accountant")
    fixed = "autodp's amplification without replacement holds for replace-one adjacency only"
    for event, reason in [(E(1.0, 0.1, "poisson"), poisson), (E(1.0, 0.1, "fixed", "add_remove", 1.0), fixed)]:
        assert RDP.why_unsupported(event) == reason
        with pytest.raises(UnsupportedEvent) as refused:
            RDP.epsilon([event], DELTA)
        assert str(refused.value) == f"the autodp accountant cannot account {event!r}: {reason}"

    class LaplaceRelease:
        pass

    assert RDP.why_unsupported(LaplaceRelease()) == "unknown event type LaplaceRelease"


@pytest.mark.parametrize("z, steps", [(0.8, 1), (3.0, 50)])
def test_fixed_size_add_remove_at_q1_is_the_gaussian_with_sensitivity_C(z, steps):
    """Without subsampling there is no amplification to restrict: a full batch under add/remove is
    the Gaussian mechanism with sigma = z (diameter 1), composed: sigma z / sqrt(steps)."""
    event = E(z, 1.0, "fixed", "add_remove", 1.0, count=steps)
    assert RDP.supports(event)
    assert RDP.epsilon([event], DELTA) == pytest.approx(gaussian_epsilon(z / math.sqrt(steps), DELTA), rel=1e-6)


@pytest.mark.parametrize("z", [0.7, 2.0, 6.0, 40.0])
def test_rdp_curve_at_q1_is_the_gaussian_closed_form(z):
    """q = 1 is the plain Gaussian: RDP(alpha) = alpha / (2 sigma^2) (Mironov 2017, Prop. 7),
    computed as such, not through autodp's amplification at probability 1."""
    for event in (E(z, 1.0, "fixed"), E(z, 1.0, "poisson", "add_remove", 1.0)):
        sigma = z / event.diameter
        assert np.array_equal(RdpAccountant().curve(event), RdpAccountant().orders / (2 * sigma**2))


def test_rdp_orders_given_as_integers_are_the_same_accountant():
    """The orders are read as floats: integer orders give the same curves and the same cache key,
    so a calibration memoized under one is found under the other."""
    ints, floats = RdpAccountant(np.arange(2, 40)), RdpAccountant(np.arange(2.0, 40.0))
    assert ints.orders.dtype == np.float64
    assert ints.cache_key() == floats.cache_key()
    event = E(1.5, 0.1, "fixed", count=30)
    assert ints.epsilon([event], DELTA) == floats.epsilon([event], DELTA)


@pytest.mark.parametrize("event", [E(2.0, 0.1, "fixed"), E(2.0, 1.0, "fixed"), PureDpEvent(0.3)],
                         ids=["subsampled", "q1", "pure"])
def test_rdp_curves_are_computed_once_per_unit_and_cannot_be_written(event):
    """A restart replays every step, so a curve is computed once per distinct unit event and the
    same array is returned after (for any count of the unit); it is read-only, so a caller cannot
    change what every later epsilon of that event is computed from."""
    acct = RdpAccountant()
    curve = acct.curve(event)
    assert acct.curve(event) is curve and acct.curve(event.with_count(7)) is curve
    assert not curve.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        curve[0] = 0.0


def randomized_response_epsilon(eps0: float, k: int, delta: float) -> float:
    """Exact epsilon(delta) of k compositions of eps0-randomized response, the worst eps0-DP
    mechanism (Kairouz, Oh & Viswanath 2015): the privacy loss is (k - 2 l) eps0 with l ~
    Binomial(k, 1 / (1 + e^eps0)), and delta(eps) = E[(1 - e^(eps - loss))_+]."""
    flips = np.arange(k + 1)
    loss = (k - 2 * flips) * eps0
    weight = binom.pmf(flips, k, 1 / (1 + math.exp(eps0)))
    return brentq(lambda e: float(np.sum(weight * np.clip(1 - np.exp(e - loss), 0, None))) - delta,
                  0.0, k * eps0, xtol=1e-12)


@pytest.mark.parametrize("eps0, k", [(0.01, 1000), (0.1, 100), (2.0, 3)])
def test_rdp_of_pure_dp_steps_is_sound_and_beats_basic_composition(eps0, k):
    """k pure eps0-DP steps: no accountant may report less than the exact epsilon of k-fold
    randomized response (every bound must hold for it). With RDP(alpha) <= min(eps0, alpha eps0^2 / 2)
    the report is at most the zCDP bound rho + 2 sqrt(rho ln(1/delta)), rho = k eps0^2 / 2 (Bun &
    Steinke 2016, Prop. 1.3), far below basic composition k eps0 for small eps0."""
    got = RdpAccountant().epsilon([PureDpEvent(eps0, count=k)], DELTA)
    assert got >= randomized_response_epsilon(eps0, k, DELTA)
    rho = k * eps0**2 / 2
    if eps0 < 1:
        assert got <= rho + 2 * math.sqrt(rho * math.log(1 / DELTA)) < k * eps0


def test_make_accountant_defaults():
    assert make_accountant("auto", "poisson").name == "pld"
    assert make_accountant("auto", "fixed").name == "autodp"
    assert isinstance(make_accountant("autodp", "poisson"), RdpAccountant)
    with pytest.raises(ValueError, match="accountant"):
        make_accountant("moments", "poisson")
    with pytest.raises(ValueError, match="sampling"):
        make_accountant("auto", "shuffle")


@pytest.mark.parametrize("sampling, per_step", [("poisson", PldAccountant), ("fixed", RdpAccountant)])
def test_make_accountant_strong_composes_per_step_bounds_of_the_auto_accountant(sampling, per_step):
    """'strong' is Dwork & Roth's theorem over per-step bounds, and those come from the accountant
    'auto' picks for the sampling: pld for Poisson, autodp for fixed-size (the only one of the two
    that can bound a fixed-size step)."""
    acct = make_accountant("strong", sampling)
    assert isinstance(acct, StrongCompositionAccountant) and acct.name == "strong"
    assert type(acct.per_step) is per_step
    event = E(2.0, 0.05, sampling, count=20)
    assert acct.epsilon([event], DELTA) == StrongCompositionAccountant(per_step()).epsilon([event], DELTA)


# --- monotonicity and calibration ---------------------------------------------------------

@pytest.mark.parametrize("acct, sampling", [(RDP, "fixed"), (PLD, "poisson")])
def test_epsilon_grows_with_steps_and_falls_with_noise(acct, sampling):
    by_steps = [acct.epsilon([E(3.0, 0.05, sampling, count=t)], DELTA) for t in (1, 10, 100, 400)]
    assert np.all(np.diff(by_steps) > 0)
    by_z = [acct.epsilon([E(z, 0.05, sampling, count=50)], DELTA) for z in (1.5, 2.0, 3.0, 5.0)]
    assert np.all(np.diff(by_z) < 0)


@pytest.mark.parametrize("target, q, steps, sampling", [
    (1.0, 0.02, 200, "poisson"),
    (0.5, 1.0, 5, "fixed"),
    (3.0, 0.05, 100, "fixed"),
])
def test_calibration_meets_the_target_and_is_tight(target, q, steps, sampling):
    acct = make_accountant("auto", sampling)
    z = calibrate_noise_multiplier(target, DELTA, q, steps, sampling, accountant=acct)

    def eps(zz):
        return acct.epsilon([E(zz, q, sampling, count=steps)], DELTA)

    assert eps(z) <= target
    assert eps(0.99 * z) > target


def test_calibration_errors():
    with pytest.raises(UnsupportedEvent):
        calibrate_noise_multiplier(1.0, DELTA, 0.1, 10, "fixed", accountant=PLD)
    with pytest.raises(ValueError, match="steps"):
        calibrate_noise_multiplier(1.0, DELTA, 0.1, 0, "poisson")
    with pytest.raises(ValueError, match="target epsilon"):
        calibrate_noise_multiplier(-1.0, DELTA, 0.1, 10, "poisson")



def test_default_pld_grid_is_tight_at_large_noise_and_many_steps():
    # Large z makes per-step losses small, where a coarse grid's pessimistic rounding adds up.
    event = [E(7.5, 0.01, "poisson", count=10000)]
    fine = PldAccountant(value_discretization_interval=3e-5).epsilon(event, DELTA)
    assert fine <= PLD.epsilon(event, DELTA) <= fine * (1 + 5e-4)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(target=st.floats(0.05, 30.0), steps=st.integers(1, 2000), diameter=st.sampled_from([2.0, math.sqrt(2)]),
       rtol=st.sampled_from([1e-3, 1e-2]))
def test_calibration_bracket_property(target, steps, diameter, rtol):
    """Over many targets (q = 1, where the fixed-size accountant is cheap and exact)."""
    z = calibrate_noise_multiplier(target, DELTA, 1.0, steps, "fixed", accountant=RDP, diameter=diameter, rtol=rtol)

    def eps(zz):
        return RDP.epsilon([E(zz, 1.0, "fixed", diameter=diameter, count=steps)], DELTA)

    assert eps(z) <= target < eps(z / (1 + rtol))


def test_calibration_is_memoized_per_accountant_settings():
    class Counting(RdpAccountant):
        calls = 0

        def epsilon(self, events, delta):
            Counting.calls += 1
            return super().epsilon(events, delta)

    acct = Counting()
    z = calibrate_noise_multiplier(0.7, DELTA, 1.0, 3, "fixed", accountant=acct)
    first = Counting.calls
    assert first > 3
    assert calibrate_noise_multiplier(0.7, DELTA, 1.0, 3, "fixed", accountant=Counting()) == z
    assert Counting.calls == first
    calibrate_noise_multiplier(0.7, DELTA, 1.0, 4, "fixed", accountant=acct)  # other arguments: computed
    assert Counting.calls > first


def test_calibration_takes_the_auto_accountant_when_none_is_given():
    assert calibrate_noise_multiplier(1.0, DELTA, 1.0, 7, "fixed") == \
        calibrate_noise_multiplier(1.0, DELTA, 1.0, 7, "fixed", accountant=make_accountant("auto", "fixed"))


def test_calibration_under_add_remove_accounts_diameter_one_whatever_diameter_is_passed():
    """Add/remove adjacency has L2 sensitivity C (diameter 1); the default diameter 2.0 belongs to
    replace-one. At q = 1 the two adjacencies differ only by the diameter."""
    z = calibrate_noise_multiplier(1.0, DELTA, 1.0, 100, "poisson", "add_remove", accountant=RDP)
    assert z == calibrate_noise_multiplier(1.0, DELTA, 1.0, 100, "poisson", "add_remove", accountant=RDP, diameter=1.0)
    assert z == calibrate_noise_multiplier(1.0, DELTA, 1.0, 100, "fixed", accountant=RDP, diameter=1.0)
    assert RDP.epsilon([E(z, 1.0, "poisson", "add_remove", 1.0, count=100)], DELTA) <= 1.0
    assert z < 0.51 * calibrate_noise_multiplier(1.0, DELTA, 1.0, 100, "fixed", accountant=RDP)  # half the diameter


def test_calibration_input_bounds():
    with pytest.raises(ValueError, match="target epsilon"):
        calibrate_noise_multiplier(0.0, DELTA, 1.0, 10, "fixed", accountant=RDP)
    with pytest.raises(ValueError, match="steps must be an integer"):
        calibrate_noise_multiplier(1.0, DELTA, 1.0, True, "fixed", accountant=RDP)
    with pytest.raises(ValueError, match="steps must be an integer"):
        calibrate_noise_multiplier(1.0, DELTA, 1.0, 2.0, "fixed", accountant=RDP)
    with pytest.raises(ValueError, match="rtol"):
        calibrate_noise_multiplier(1.0, DELTA, 1.0, 10, "fixed", accountant=RDP, rtol=0.5)
    from stream_vips.privacy.calibration import MIN_CALIBRATION_RTOL

    z = calibrate_noise_multiplier(1.0, DELTA, 1.0, 10, "fixed", accountant=RDP, rtol=MIN_CALIBRATION_RTOL)
    eps = RDP.epsilon([E(z, 1.0, "fixed", count=10)], DELTA)
    assert eps <= 1.0 < RDP.epsilon([E(z / (1 + MIN_CALIBRATION_RTOL), 1.0, "fixed", count=10)], DELTA)


@pytest.mark.parametrize("target, steps, diameter, rtol, z", [
    (0.2, 1, 2.0, 1e-3, 32.61809037424726),
    (0.2, 10000, 2.0, 1e-3, 3261.8090374247263),
    (1.0, 1, 2.0, 1e-3, 7.4617979661393194),
    (1.0, 100, 2.0, 1e-3, 74.6179796613932),
    (8.0, 1, 2.0, 1e-3, 1.2009173380040954),
    (8.0, 10000, 2.0, 1e-3, 120.09173380040954),
    (1.0, 100, math.sqrt(2), 1e-2, 52.99296090116496),
])
def test_calibration_is_reproducible(target, steps, diameter, rtol, z):
    """The z the search returns, pinned: the bracket property above admits any z in a window of
    width rtol, and which one is returned depends on the search path (start, bracket growth,
    probes). A change to the search that keeps the property still changes the noise a configured
    run gets, so it must show here and update these values deliberately (RDP at q = 1: closed form)."""
    got = calibrate_noise_multiplier(target, DELTA, 1.0, steps, "fixed", accountant=RDP, diameter=diameter, rtol=rtol)
    assert got == pytest.approx(z, rel=1e-12)


# --- the calibration search on epsilon curves of chosen shape ---------------------------------
# The search sees only epsilon(z), so an accountant whose epsilon is a chosen function of z reaches
# every branch cheaply and exactly: roots hit by a probe, curves far from the power law the search
# interpolates with, starts clamped at either end, the refusals at the ends of the z range.

class Shaped(Accountant):
    """epsilon(z) = scale * shape(z) for the one event a calibration asks about; counts its calls."""

    name = "shaped"

    def __init__(self, shape, scale=1.0):
        self.shape, self.scale, self.calls = shape, scale, 0

    def why_unsupported(self, event):
        return None

    def epsilon_of_counts(self, counts, delta):
        self.calls += 1
        (event, _), = counts.items()
        return self.scale * self.shape(event.noise_multiplier)


START = 6.786140424415112  # the search's first z at target 1, q = 1, one step, DELTA: 2 sqrt(ln(1/DELTA))
SHAPES = {
    "power": lambda z: (7.0 / z) ** 2,  # the search's own model: interpolation is exact
    "exp": lambda z: 50.0 * math.exp(-z),
    "step": lambda z: 1e6 if z < 3.3 else 0.999,  # interpolation aims at the wrong end every time
    "step-low": lambda z: 1.0001 if z < 9.1 else 1e-6,  # ... at the other end
    "zero-above": lambda z: 30.0 if z < 2.2 else 0.0,  # no power law through epsilon 0: midpoint probes
    "steep-flat": lambda z: (4.0 / z) ** 6 if z < 4.0 else (4.0 / z) ** 0.5,
    "flat-steep": lambda z: (4.0 / z) ** 0.3 if z < 4.0 else (4.0 / z) ** 12,
    "root-at-start": lambda z: (START / z) ** 2,
    "root-at-twice-start": lambda z: (2 * START / z) ** 2,
    "root-below-start": lambda z: (0.8 / z) ** 3,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("rtol", [1e-3, 1e-9, 0.3])
def test_calibration_bracket_property_on_shaped_curves(shape, rtol):
    acct = Shaped(SHAPES[shape])
    z = calibrate_noise_multiplier(1.0, DELTA, 1.0, 1, "fixed", accountant=acct, rtol=rtol)
    assert acct.shape(z) <= 1.0 < acct.shape(z / (1 + rtol))


@pytest.mark.parametrize("shape, rtol, z", [
    ("power", 1e-3, 7.002333333333333),
    ("exp", 1e-3, 3.912326352376478),
    ("step", 1e-3, 3.300197171268847),
    ("steep-flat", 1e-9, 4.0000000000294795),
    ("flat-steep", 1e-3, 4.000666370874727),
    ("root-at-start", 1e-3, START),  # a probe on the root returns it exactly
    ("root-at-twice-start", 1e-3, 2 * START),
    ("root-below-start", 1e-3, 0.8002666666666667),
    ("exp", 1e-9, 3.9120230067208595),
    ("step", 1e-9, 3.300000002035779),
    ("step-low", 1e-3, 9.103487931724262),
    ("zero-above", 1e-3, 2.2003171530217753),
])
def test_calibration_is_reproducible_on_shaped_curves(shape, rtol, z):
    """The value returned, pinned (see test_calibration_is_reproducible): which z of the final
    bracket comes back depends on every step of the search."""
    got = calibrate_noise_multiplier(1.0, DELTA, 1.0, 1, "fixed", accountant=Shaped(SHAPES[shape]), rtol=rtol)
    assert got == pytest.approx(z, rel=1e-12)


@pytest.mark.parametrize("target, q, shape, z", [
    (1e-5, 1.0, lambda z: math.exp((3e5 - z) / 1e5), 300075.2107184735),  # start clamped at 1e5
    (1.0, 0.01, lambda z: math.exp(3 * (1.2 - z)), 1.2000915820685565),  # start clamped at 0.5
])
def test_calibration_is_reproducible_from_a_clamped_start(target, q, shape, z):
    got = calibrate_noise_multiplier(target, DELTA, q, 1, "fixed", accountant=Shaped(shape, target))
    assert got == pytest.approx(z, rel=1e-12)


def test_calibration_takes_the_ends_of_the_noise_range_and_refuses_beyond():
    from stream_vips.privacy.accountants import MIN_NOISE_MULTIPLIER

    # target and q chosen so that the search starts at exactly 0.512 = 2**9 MIN_NOISE_MULTIPLIER:
    # halving reaches z = MIN_NOISE_MULTIPLIER exactly, which is evaluated (and brackets the root)
    target, q = 0.6627090258217883, 0.05
    acct = Shaped(lambda z: 1e3 if z < 0.0015 else 0.5, target)
    z = calibrate_noise_multiplier(target, DELTA, q, 1, "fixed", accountant=acct)
    assert MIN_NOISE_MULTIPLIER < z < 2 * MIN_NOISE_MULTIPLIER
    with pytest.raises(ValueError, match="too loose"):
        calibrate_noise_multiplier(target, DELTA, q, 1, "fixed", accountant=Shaped(lambda z: 0.5, target))
    # start at exactly 62500: doubling reaches z = 1e6 exactly, which is evaluated
    target = 0.00010857824679064179
    acct = Shaped(lambda z: 2.0 if z < 9e5 else 0.5, target)
    z = calibrate_noise_multiplier(target, DELTA, 1.0, 1, "fixed", accountant=acct)
    assert 9e5 <= z < 9e5 * 1.001
    with pytest.raises(ValueError, match="above 1e6"):
        calibrate_noise_multiplier(target, DELTA, 1.0, 1, "fixed", accountant=Shaped(lambda z: 2.0, target))
    # start at 62500.03: doubling goes from 500000.24 to 1000000.48, past 1e6: refused unevaluated
    target = 0.00010857819467310834
    acct = Shaped(lambda z: 2.0 if z < 9e5 else 0.5, target)
    with pytest.raises(ValueError, match="above 1e6"):
        calibrate_noise_multiplier(target, DELTA, 1.0, 1, "fixed", accountant=acct)


def test_calibration_stops_at_a_bracket_exactly_one_plus_rtol_wide():
    """hi / lo <= 1 + rtol ends the search, equality included. The step curve (root 7.5) makes the
    first narrowing a bisection of [START, 2 START]: hi = sqrt(START * 2 START), and rtol is chosen
    so that hi / START is exactly 1 + rtol (both are floats in [1, 2): the subtraction is exact)."""
    g = math.sqrt(START * (2 * START))
    rtol = g / START - 1
    assert 1 + rtol == g / START
    z = calibrate_noise_multiplier(1.0, DELTA, 1.0, 1, "fixed", accountant=Shaped(lambda z: 1e6 if z < 7.5 else 0.999),
                                   rtol=rtol)
    assert z == g


class Recording(Shaped):
    """A Shaped accountant that also records every z the search evaluates, in order."""

    def __init__(self, shape, scale=1.0):
        super().__init__(shape, scale)
        self.probes = []

    def epsilon_of_counts(self, counts, delta):
        (event, _), = counts.items()
        self.probes.append(event.noise_multiplier)
        return super().epsilon_of_counts(counts, delta)


def _power_search_probes():
    """The z the search evaluates on the power curve (root 7): START, then 2 START (doubling), then
    the two probes g / step and g * step around the interpolated root g."""
    acct = Recording(SHAPES["power"])
    calibrate_noise_multiplier(1.0, DELTA, 1.0, 1, "fixed", accountant=acct)
    assert acct.probes[:2] == [START, 2 * START] and len(acct.probes) == 4
    return acct.probes[2:]


def _flat_from(a, outside=None):
    """epsilon = 1e6 below ``a``, exactly the target 1 from ``a`` on; with ``outside``, that curve
    is followed at and outside [START, 2 START] and 2 stands in for 1e6, so the search sees the
    same bracket ends (and so the same probes) as on ``outside``."""
    if outside is None:
        return lambda z: 1e6 if z < a else 1.0
    return lambda z: outside(z) if not START < z < 2 * START else 2.0 if z < a else 1.0


@pytest.mark.parametrize("where", ["start", "doubling", "halving", "bisection", "lower probe", "upper probe"])
def test_calibration_returns_the_noise_that_spends_exactly_the_target(where):
    """epsilon(z) <= target admits equality: a z whose epsilon is exactly the target is within it.
    On a curve that is above the target below some a and exactly at it from a on, the smallest
    admissible z is a itself, and whichever step of the search first evaluates a (the start, the
    doubling or halving that finds the bracket, a bisection, either probe around the interpolated
    root) must keep it as the upper end, so that a is what comes back, exactly."""
    lower, upper = _power_search_probes()
    a, shape = {
        "start": (START, None),
        "doubling": (2 * START, None),
        "halving": (START / 2, None),
        "bisection": (math.sqrt(START * (2 * START)), None),  # the step curve's first narrowing is one
        "lower probe": (lower, SHAPES["power"]),
        "upper probe": (upper, SHAPES["power"]),
    }[where]
    acct = Recording(_flat_from(a, shape))
    z = calibrate_noise_multiplier(1.0, DELTA, 1.0, 1, "fixed", accountant=acct)
    assert acct.shape(a) == 1.0 < acct.shape(a / (1 + 1e-12))  # a is the smallest admissible z
    assert a in acct.probes and z == a


def _probe_on_a_bracket_end(end):
    """(e_lo, e_hi) on the bracket [START, 2 START] (hi / lo = 2) that put one probe around the
    interpolated root g = lo 2^t, t = ln(e_lo / target) / ln(e_lo / e_hi), target 1, exactly on a
    bracket end: g / step == lo ('lower', t = log2(step)) or g * step == hi ('upper',
    t = 1 - log2(step)), step = 1 + rtol / 3. With one of the two fixed, t gives the other in closed
    form; the search's own arithmetic then lands exactly on the end at it or at a neighbouring double."""
    lo, hi, step = START, 2 * START, 1 + 1e-3 / 3
    s = math.log2(step)
    if end == "lower":  # e_hi = 1/2: t = ln e_lo / (ln e_lo + ln 2) = s
        fixed, solved = 0.5, math.exp(s * math.log(2) / (1 - s))
    else:  # e_lo = 4: t = ln 4 / (ln 4 - ln e_hi) = 1 - s
        fixed, solved = 4.0, math.exp(-math.log(4) * s / (1 - s))
    for k in range(64):
        for candidate in (solved + k * np.spacing(solved), solved - k * np.spacing(solved)):
            e_lo, e_hi = (candidate, fixed) if end == "lower" else (fixed, candidate)
            g = lo * (hi / lo) ** (math.log(e_lo) / math.log(e_lo / e_hi))
            if (g / step == lo) if end == "lower" else (g * step == hi):
                return e_lo, e_hi
    pytest.skip("no double near the closed form lands a probe exactly on the bracket end here")


@pytest.mark.parametrize("end", ["lower", "upper"])
def test_calibration_never_evaluates_a_noise_multiplier_twice(end):
    """Each evaluation is an accounting (the expensive part at small z), and the ends of the bracket
    are already known to be above / within the target: a probe that would land on one of them is
    replaced by a bisection, so every z the search evaluates is new. The curve is chosen so that
    the interpolation puts a probe exactly on the lower (upper) end of the first bracket."""
    e_lo, e_hi = _probe_on_a_bracket_end(end)
    acct = Recording(lambda z: e_lo if z <= START else 2.0 if z < 2 * START else e_hi)  # root: 2 START
    z = calibrate_noise_multiplier(1.0, DELTA, 1.0, 1, "fixed", accountant=acct)
    assert acct.probes[:2] == [START, 2 * START] and len(set(acct.probes)) == len(acct.probes)
    assert z == 2 * START


@pytest.mark.parametrize("shape", ["step", "steep-flat", "flat-steep", "exp"])
def test_calibration_ends_within_its_pass_cap_at_the_finest_tolerance(shape):
    """Far from a power law every interpolation misses and is followed by a bisection: about two
    passes per halving of ln(hi / lo), the most the search may take, at the smallest rtol."""
    from stream_vips.privacy.calibration import MIN_CALIBRATION_RTOL

    acct = Shaped(SHAPES[shape])
    z = calibrate_noise_multiplier(1.0, DELTA, 1.0, 1, "fixed", accountant=acct, rtol=MIN_CALIBRATION_RTOL)
    assert acct.shape(z) <= 1.0 < acct.shape(z / (1 + MIN_CALIBRATION_RTOL))


# --- PLD reports in bounded time and memory: grid of counts, interval following epsilon ------

from stream_vips.privacy.accountants import GRID_EXACT_COUNTS, GRID_RATIO, grid_count, pmf_epsilon  # noqa: E402


def test_grid_count_rounds_up_monotonically_and_idempotently():
    n = np.unique(np.concatenate([np.arange(1, 3000), np.geomspace(1, 1e12, 4000).astype(np.int64)]))
    g = np.array([grid_count(int(k)) for k in n])
    assert np.all(g >= n) and np.all(np.diff(g) >= 0)
    assert all(grid_count(int(k)) == k for k in g)  # grid points map to themselves
    assert np.all(g[n <= GRID_EXACT_COUNTS] == n[n <= GRID_EXACT_COUNTS])
    # a grid cell never spans more than one ratio step: the report is never for more than
    # n * GRID_RATIO + 1 compositions
    assert np.all(g <= n * GRID_RATIO + 1)


@pytest.mark.parametrize("z, q, n, h", [(2.0, 0.1, 1, 1e-3), (2.0, 0.1, 60, 1e-3), (1.0, 0.01, 2000, 1e-3),
                                        (3.0, 0.2, 30, 1e-2)])
def test_vectorized_epsilon_equals_dp_accounting_loop(z, q, n, h):
    pmf = PLD.pld(E(z, q, "poisson"), h).self_compose(n)._pmf_remove.to_dense_pmf()
    ours = pmf_epsilon(pmf._lower_loss, pmf._probs, h, pmf._infinity_mass, DELTA)
    assert ours == pytest.approx(pmf.get_epsilon_for_delta(DELTA), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("z, steps", [(0.05, 1), (0.2, 10), (1.0, 1000), (2.0, 300), (2.0, 3000), (10.0, 10**6),
                                      (30.0, 10**6)])
def test_pld_report_is_an_upper_bound_exact_at_grid_points_q1(z, steps):
    """Poisson with q = 1 is the Gaussian mechanism; n Gaussians with std zC on sensitivity 2C
    compose to one with sigma = z / (2 sqrt(n)). The report is for g(n) >= n compositions, so it
    lies between the exact epsilon at n and (up to the discretization's small, pessimistic
    error) the exact epsilon at g(n); the cases reach epsilon ~ 10^3, where e^-loss underflows."""
    report = PLD.epsilon([E(z, 1.0, "poisson", count=steps)], DELTA)
    g = PLD.grid(steps)
    exact_n, exact_g = gaussian_epsilon(z / 2 / math.sqrt(steps), DELTA), gaussian_epsilon(z / 2 / math.sqrt(g), DELTA)
    assert exact_n <= exact_g <= report <= exact_g * (1 + 1e-4) + 1e-4


@pytest.mark.parametrize("z, q, top, spacing", [(2.0, 0.1, 600, "every"), (1.0, 0.01, 300_000, "geometric")])
def test_pld_reports_never_decrease_as_steps_are_added(z, q, top, spacing):
    """Across the exact region, the geometric grid and every change of discretization interval."""
    acct = PldAccountant()
    unit = E(z, q, "poisson")
    if spacing == "every":
        counts = np.arange(1, top + 1)
    else:
        counts = np.unique(np.geomspace(1, top, 160).astype(int))
    reports = np.array([acct.epsilon_of_counts({unit: int(n)}, DELTA) for n in counts])
    intervals = {acct.interval({unit: acct.grid(int(n))}) for n in counts}
    assert len(intervals) >= 3  # the test crosses changes of the interval
    assert np.all(np.diff(reports) >= 0)
    assert np.all(np.diff(reports)[: GRID_EXACT_COUNTS - 1] > 0) if spacing == "every" else True


def test_pld_rounds_each_unit_of_a_mixed_ledger_up_and_stays_above_the_exact_counts():
    a, b = E(3.0, 0.05, "poisson"), E(5.0, 0.2, "poisson", count=1)
    counts = {a: 1000, b: 301}
    report = PLD.epsilon_of_counts(counts, DELTA)
    assert report == PLD.epsilon_at({a: PLD.grid(1000), b: PLD.grid(301)}, DELTA)
    assert report >= PLD.epsilon_at(counts, DELTA)
    assert PLD.epsilon_of_counts({a: 1000, b: 302}, DELTA) >= report


@pytest.mark.parametrize("z, q, steps", [(1.0, 0.01, 10**6), (1.0, 0.01, 10**9), (0.05, 0.1, 500)])
def test_pld_memory_is_bounded_and_the_interval_follows_epsilon(z, q, steps):
    """One evaluation allocates O(max_points) whatever the count or epsilon (traced numpy
    memory, which the old 10^-4 grid took to gigabytes), and the interval grows with epsilon."""
    import tracemalloc

    acct = PldAccountant()
    unit = E(z, q, "poisson")
    acct.epsilon_of_counts({unit: 1}, DELTA)  # the one-release PLDs, built once
    tracemalloc.start()
    try:
        eps = acct.epsilon_of_counts({unit: steps}, DELTA)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a few complex FFT buffers of <= max_points (2^18) entries, plus the one-release PLD
    assert peak < 80 * 2**20
    assert math.isfinite(eps) and eps > 0
    h = acct.interval({unit: acct.grid(steps)})
    assert h >= min(eps, 1e4) * 2e-6  # large epsilon, coarse grid: the grid follows epsilon
    assert len(acct._units) <= 4 and len(acct._values) <= 4096


def test_pld_default_accuracy_against_a_fine_fixed_grid_at_a_million_steps():
    """At 10^6 steps the adaptive grid (coarser than 10^-4) stays within 0.1% of dp_accounting's
    own accountant on a grid 4x finer than ours, and above it (both are upper bounds; the finer
    one is tighter)."""
    unit = E(1.0, 0.01, "poisson")
    n = PLD.grid(10**6)
    h = PLD.interval({unit: n})
    acct = PLDAccountant(NR.REPLACE_ONE, value_discretization_interval=h / 4)
    acct.compose(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), n)
    fine = acct.get_epsilon(DELTA)
    ours = PLD.epsilon([unit.with_count(10**6)], DELTA)
    assert fine <= ours <= fine * (1 + 1e-3)


# --- PLD accountant: pieces pinned against closed forms and dp_accounting's own objects ------

from dp_accounting.pld import common as pld_common  # noqa: E402
from dp_accounting.pld import privacy_loss_distribution as pld_lib  # noqa: E402

from stream_vips.privacy.accountants import pld as pld_module  # noqa: E402
from stream_vips.privacy.accountants import rebin  # noqa: E402


def hockey_stick(lower, probs, interval, infinity_mass, eps):
    """delta(eps) = inf_mass + sum_i p_i (1 - e^(eps - l_i))_+ of a discretized PLD, summed
    directly (only losses above eps enter, so nothing overflows)."""
    losses = (lower + np.arange(len(probs))) * interval
    above = losses > eps
    return infinity_mass + float(np.sum(probs[above] * -np.expm1(eps - losses[above])))


def rounded_response_epsilon(e0, k, delta, up=None, down=None):
    """Exact epsilon of k compositions of randomized response's PLD: loss ``up`` (default e0) with
    probability 1 / (1 + e^-e0) and ``down`` (default -e0) otherwise, from the binomial law of
    the number of ``up`` outcomes."""
    up, down = (e0 if up is None else up), (-e0 if down is None else down)
    i = np.arange(k + 1)
    w = binom.pmf(i, k, 1.0 / (1.0 + math.exp(-e0)))
    losses = i * up + (k - i) * down
    def gap(eps):
        return float(np.sum(w * np.maximum(0.0, -np.expm1(eps - losses)))) - delta
    return 0.0 if gap(0.0) <= 0 else brentq(gap, 0.0, k * max(up, 0.0) + 1.0, xtol=1e-13, rtol=1e-14)


def test_pld_settings_refuse_a_zero_interval_and_keep_the_measured_defaults():
    """A zero interval would divide by zero later; the defaults are those the accuracy and memory
    tests above were measured with (dp_accounting's 1e-4 grid, 2^18 points, accuracy 200)."""
    for bad in (0.0, -1e-4, math.nan):
        with pytest.raises(ValueError, match="value_discretization_interval"):
            PldAccountant(bad)
    acct = PldAccountant()
    assert (acct.value_discretization_interval, acct.max_points, acct.accuracy) == (1e-4, 2**18, 200.0)
    assert (acct.exact_counts, acct.grid_ratio) == (GRID_EXACT_COUNTS, GRID_RATIO)


def test_pld_of_one_release_is_dp_accountings_own():
    """``pld`` builds dp_accounting's PLD on the requested grid (default the finest): the Gaussian
    with sensitivity 1 and std z under the event's relation, and randomized response for pure DP."""
    def dense(pld):
        pmf = pld._pmf_remove.to_dense_pmf()
        return pmf._lower_loss, pmf._probs, pmf._infinity_mass
    for event, h in [(E(1.5, 0.1, "poisson"), None), (E(1.5, 0.1, "poisson", "add_remove", 1.0), 1e-3)]:
        rel = NR.REPLACE_ONE if event.adjacency == "replace_one" else NR.ADD_OR_REMOVE_ONE
        theirs = pld_lib.from_gaussian_mechanism(1.5, sensitivity=1.0, sampling_prob=0.1, neighboring_relation=rel,
                                                 value_discretization_interval=1e-4 if h is None else h)
        ours = PLD.pld(event, h)
        for a, b in ((ours._pmf_remove, theirs._pmf_remove), (ours._pmf_add, theirs._pmf_add)):
            da, db = dense(pld_lib.PrivacyLossDistribution(a)), dense(pld_lib.PrivacyLossDistribution(b))
            assert da[0] == db[0] and da[2] == db[2]
            np.testing.assert_array_equal(da[1], db[1])
    for h in (None, 1e-2):
        lower, probs, inf_mass = dense(PLD.pld(PureDpEvent(0.5), h))
        step = 1e-4 if h is None else h
        theirs = dense(pld_lib.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(0.5, 0.0),
                                                       value_discretization_interval=step))
        assert (lower, inf_mass) == (theirs[0], theirs[2]) == (lower, 0.0)
        np.testing.assert_array_equal(probs, theirs[1])


@pytest.mark.parametrize("e0, k", [(1.0, 1), (0.5, 2), (0.3, 7), (0.1, 40), (0.05, 600), (0.02, 3000)])
def test_pld_of_pure_dp_steps_is_the_randomized_response_composition(e0, k):
    """k pure e0-DP releases are accounted by k compositions of randomized response (their
    dominating pair), each loss rounded outward to the grid h: the report is the binomial closed
    form at the rounded losses, and lies between the exact one and the one at e0 + h."""
    acct = PldAccountant()
    report = acct.epsilon_at({PureDpEvent(e0): k}, DELTA)
    h = acct.interval({PureDpEvent(e0): k})
    # dp_accounting rounds both losses up to the grid, keeping the probabilities
    rounded = rounded_response_epsilon(e0, k, DELTA, math.ceil(e0 / h) * h, math.ceil(-e0 / h) * h)
    assert report == pytest.approx(rounded, rel=1e-7, abs=1e-9)
    exact = rounded_response_epsilon(e0, k, DELTA)
    assert exact * (1 - 1e-9) <= report <= rounded_response_epsilon(e0, k, DELTA, e0 + h, -e0 + h) * (1 + 1e-9)
    assert acct.epsilon_of_counts({PureDpEvent(e0): k}, DELTA) >= report


class _ApproxDpPld(PldAccountant):
    """Accounts each ``PureDpEvent(eps)`` as an (eps, DELTAS[eps])-DP release: dp_accounting's PLD
    of that pair has an infinite loss with probability DELTAS[eps], which composition must carry."""

    DELTAS = {0.5: 1e-4, 0.2: 2e-5}

    def pld(self, event, interval=None):
        h = self.value_discretization_interval if interval is None else float(interval)
        params = pld_common.DifferentialPrivacyParameters(event.epsilon, self.DELTAS[event.epsilon])
        return pld_lib.from_privacy_parameters(params, value_discretization_interval=h)


def test_pld_composes_the_probability_of_an_infinite_loss():
    """n releases with an infinite loss of probability d_i each have an infinite loss with
    probability M = 1 - prod (1 - d_i)^n_i, so epsilon is infinite exactly for delta < M (up to
    the 1e-15 tail cuts), in one- and two-level compositions and for mixed ledgers."""
    acct = _ApproxDpPld()
    a, b = PureDpEvent(0.5), PureDpEvent(0.2)
    for counts in ({a: 700}, {a: 700, b: 1000}, {b: 3, a: 2}):
        mass = 1 - math.prod((1 - acct.DELTAS[u.epsilon]) ** n for u, n in counts.items())
        assert acct.epsilon_at(counts, mass * (1 - 1e-6)) == math.inf
        assert math.isfinite(acct.epsilon_at(counts, mass * (1 + 1e-6)))
    # the two-level composition (a grid coarser than the block's): block and remainder masses combine
    h = 0.0064
    assert acct.interval({a: 700 // pld_module.BLOCKS}) < h
    lower, probs, inf_mass = acct._compose_side(a, acct._sides(a, h), 0, 700, h)
    assert inf_mass == pytest.approx(1 - (1 - 1e-4) ** 700, rel=1e-9)
    assert float(np.sum(probs)) == pytest.approx((1 - 1e-4) ** 700, rel=1e-9)


def test_self_composition_matches_repeated_convolution_on_its_index_range():
    """``_Pmf.self_compose``: the n-fold convolution restricted to ``bounds(n)`` (every point of
    it, nothing beyond), the infinite loss 1 - (1 - d)^n plus the cut tail, and a probability."""
    rng = np.random.default_rng(3)
    probs = rng.random(7) ** 3
    probs /= probs.sum() / (1 - 0.01)
    pmf = pld_module._Pmf(-3, probs, 0.01)
    full = probs
    for n in range(2, 9):
        full = np.convolve(full, probs)
        lower, out, inf_mass = pmf.self_compose(n)
        lo, hi = pmf.bounds(n)
        assert lower == -3 * n + lo and len(out) == hi - lo + 1
        np.testing.assert_allclose(out, full[lo:hi + 1], rtol=1e-9, atol=1e-15)
        assert inf_mass == pytest.approx(pld_module.TAIL_MASS + 1 - 0.99**n, rel=1e-12)
    # a wide one whose 20-fold tails are cut on both sides (lo > 0): the window starts at lo
    wide = np.exp(-0.5 * ((np.arange(301) - 150) / 12.0) ** 2)
    wide /= wide.sum()
    pmf = pld_module._Pmf(10, wide, 0.0)
    lo, hi = pmf.bounds(20)
    assert 0 < lo and hi < 6000
    lower, out, _ = pmf.self_compose(20)
    full = wide
    for _ in range(19):
        full = np.convolve(full, wide)
    assert lower == 200 + lo and len(out) == hi - lo + 1
    np.testing.assert_allclose(out, full[lo:hi + 1], rtol=1e-9, atol=1e-14)  # FFT round-off
    assert full[:lo].sum() + full[hi + 1:].sum() <= pld_module.TAIL_MASS
    # a release that is almost surely infinite: the composed infinite loss is a probability
    assert pld_module._Pmf(0, np.array([0.5]), 0.5).self_compose(100)[2] == 1.0


def test_chernoff_bounds_of_a_self_composition():
    """``_Pmf.bounds``: the exact index range of the n-fold support cut by the Chernoff bound
    P[S >= t] <= E[e^{oS}] e^{-ot} at the orders +-1..20 / size, each side at TAIL_MASS / 2; the
    mass of the true n-fold convolution outside it is below that."""
    rng = np.random.default_rng(5)
    probs = np.exp(-0.5 * ((np.arange(301) - 150) / 12.0) ** 2) * (1 + 0.1 * rng.random(301))
    probs /= probs.sum()
    pmf = pld_module._Pmf(0, probs, 0.0)
    orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / len(probs)
    idx = np.arange(len(probs))
    log_mgf = np.log(np.exp(np.outer(orders, idx)) @ probs)
    for n in (1, 2, 3, 50):
        cut = (n * log_mgf + math.log(2 / pld_module.TAIL_MASS)) / orders
        hi = min((len(probs) - 1) * n, math.ceil(cut[orders > 0].min()))
        lo = max(0, math.floor(cut[orders < 0].max()))
        assert pmf.bounds(n) == (lo, hi)
    assert pmf.bounds(1) == (0, len(probs) - 1)  # one release: its whole support
    two = np.convolve(probs, probs)
    lo, hi = pmf.bounds(2)
    assert two[:lo].sum() <= pld_module.TAIL_MASS / 2 and two[hi + 1:].sum() <= pld_module.TAIL_MASS / 2
    # two spikes: the 2-fold support's both ends carry mass, and the bounds keep them
    spikes = pld_module._Pmf(0, np.array([0.4] + [0.0] * 99 + [0.6]), 0.0)
    assert spikes.bounds(2) == (0, 200) and spikes.bounds(1) == (0, 100)


def test_rebin_spreads_each_mass_onto_the_two_coarse_neighbours_keeping_the_mass_and_e_minus_loss():
    """``rebin``: brute force over the fine points (the mass at l in [a, a + c) goes to a and a + c
    with weights keeping E[e^-L]); the result covers floor(first / r) .. floor(last / r) + 1."""
    rng = np.random.default_rng(11)
    fine, ratio = 0.01, 4
    for lower, size in [(-37, 50), (-8, 8), (5, 13), (-12, 1)]:
        probs = rng.random(size)
        probs /= probs.sum()
        base, out = rebin(lower, probs, fine, ratio * fine)
        idx = lower + np.arange(size)
        a = np.floor_divide(idx, ratio)
        t = (idx - a * ratio) * fine
        c = ratio * fine
        beta = (np.exp(-t) - np.exp(-c)) / (1 - np.exp(-c))
        ref = np.zeros(a[-1] - a[0] + 2)
        np.add.at(ref, a - a[0], beta * probs)
        np.add.at(ref, a - a[0] + 1, (1 - beta) * probs)
        assert base == a[0]
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-17)
        losses = (base + np.arange(len(out))) * c
        assert out.sum() == pytest.approx(1.0, rel=1e-12)
        assert np.dot(out, np.exp(-losses)) == pytest.approx(np.dot(probs, np.exp(-idx * fine)), rel=1e-12)


@pytest.mark.parametrize("lower, points, interval, infinity_mass, delta", [
    (-1, {0: 1 / (1 + math.e**0.1), 2: 1 / (1 + math.e**-0.1)}, 0.1, 0.0, 0.1),  # delta(0) <= delta: 0
    (1, {0: 1 - 1e-6, 1: 1e-6}, 5.0, 0.0, DELTA),  # below every loss, with mass missing: 5 - 9e-6
    (1, {0: 1 - 1e-6, 24: 1e-6}, 30.0, 0.0, DELTA),  # the same 720 apart: e^720 overflows
    (-3, {0: 0.5 - 1e-7, 4: 0.5, 75: 1e-7}, 10.0, 0.0, DELTA),  # losses -30, 10, 720
    (5, {0: 1 - DELTA}, 0.1, DELTA, DELTA),  # infinite loss exactly delta: the largest loss
    (-2, {0: 0.3, 1: 0.2, 3: 0.5 - 2e-6}, 0.5, 2e-6, DELTA),
])
def test_pmf_epsilon_is_the_smallest_epsilon_within_delta(lower, points, interval, infinity_mass, delta):
    """``pmf_epsilon`` against the hockey-stick divergence summed directly: delta(eps) <= delta at
    the answer and > delta just below it (or the answer is 0 and delta(0) <= delta), including
    answers below every loss, an infinite loss of exactly delta and losses > 709 apart."""
    probs = np.zeros(max(points) + 1)
    probs[list(points)] = list(points.values())
    eps = pmf_epsilon(lower, probs, interval, infinity_mass, delta)
    assert math.isfinite(eps)
    assert hockey_stick(lower, probs, interval, infinity_mass, eps) <= delta * (1 + 1e-9)
    if eps == 0.0:
        assert hockey_stick(lower, probs, interval, infinity_mass, 0.0) <= delta
    else:
        assert eps > 0 and hockey_stick(lower, probs, interval, infinity_mass, eps - 1e-9 * max(1.0, eps)) > delta
    assert pmf_epsilon(lower, probs, interval, delta * 1.5, delta) == math.inf


@pytest.mark.parametrize("exact, ratio", [(100, 1.015), (256, GRID_RATIO), (10, 1.5), (1, 2.0), (37, 1.1)])
def test_grid_count_is_the_smallest_grid_point_at_or_above_n(exact, ratio):
    """Against the grid listed by brute force: 1..exact, then ceil(exact * ratio^k), k >= 1; the
    accountant's ``grid`` uses its own settings."""
    geometric = np.ceil(exact * ratio ** np.arange(1, 400))
    points = np.unique(np.concatenate([np.arange(1, exact + 1), geometric[geometric < 1e9].astype(np.int64)]))
    n = np.arange(1, min(points[-1], 20_000) + 1)
    expected = points[np.searchsorted(points, n)]
    assert [grid_count(int(k), exact, ratio) for k in n] == expected.tolist()
    acct = PldAccountant(exact_counts=exact, grid_ratio=ratio)
    assert [acct.grid(int(k)) for k in n[::7]] == expected[::7].tolist()


def test_pld_counts_its_evaluations_and_caches_each_rounded_composition():
    """One evaluation per rounded composition and delta (counts in one grid cell share it), none
    for an empty ledger (epsilon 0); the cache answers only its own key."""
    acct = PldAccountant()
    u = E(2.0, 0.1, "poisson")
    assert acct.epsilon_at({}, DELTA) == 0.0 and acct.epsilon_of_counts({}, DELTA) == 0.0
    assert acct.evaluations == 0
    first = acct.epsilon_of_counts({u: 300}, DELTA)
    assert acct.epsilon_of_counts({u: acct.grid(300)}, DELTA) == first and acct.evaluations == 1
    other = acct.epsilon_of_counts({u: 300}, 1e-3)
    assert acct.evaluations == 2 and other < first
    assert acct.epsilon_of_counts({u: 300}, DELTA) == first and acct.evaluations == 2
    more = acct.epsilon_of_counts({u: 400}, DELTA)
    assert acct.evaluations == 3 and more > first
    acct.epsilon_at({u: 300}, DELTA)
    assert acct.evaluations == 4
    assert "object" in acct.why_unsupported(object())


def test_pld_takes_the_worse_side_of_an_asymmetric_distribution():
    """epsilon is the max over the remove and add sides (dp_accounting's ``get_epsilon_for_delta``):
    pinned with the add/remove Gaussian as is (remove side worse) and with its sides swapped."""
    class Swapped(PldAccountant):
        def pld(self, event, interval=None):
            p = super().pld(event, interval)
            return pld_lib.PrivacyLossDistribution(p._pmf_add, p._pmf_remove)

    u = E(1.0, 0.1, "poisson", "add_remove", 1.0)
    for acct in (PldAccountant(), Swapped()):
        for counts in ({u: 10}, {u: 10, E(2.0, 0.2, "poisson", "add_remove", 1.0): 5}):
            h = acct.interval(counts)
            theirs = None
            for unit, n in counts.items():
                one = acct.pld(unit, h).self_compose(n)
                theirs = one if theirs is None else theirs.compose(one)
            assert acct.epsilon_at(counts, DELTA) == pytest.approx(theirs.get_epsilon_for_delta(DELTA), rel=1e-7)


def test_pld_interval_follows_its_documented_rule():
    """h = h0 2^k, k the largest of 0, floor(log2(sqrt(W / n) / accuracy / h0)) and
    ceil(log2(W / h0 / max_points)), W the summed Chernoff widths of the composed sides (both
    sides of an asymmetric pair) on the reference grid; that grid is the finest h0 2^j on which
    the loss range 2 (20 / z + 2 / z^2) of a subsampled Gaussian spans at most 2^14 points."""
    def rule(acct, counts):
        h0, width, total = acct.value_discretization_interval, 0.0, 0
        for unit, n in counts.items():
            h, sides = acct._width_model(unit)
            width += max((side.bounds(n)[1] - side.bounds(n)[0] + 1) * h for side in sides)
            total += n
        accurate = math.sqrt(width / total) / acct.accuracy
        return h0 * 2 ** max(0, math.floor(math.log2(accurate / h0)) if accurate > h0 else 0,
                             math.ceil(math.log2(width / h0 / acct.max_points)))

    add_remove = E(1.0, 0.1, "poisson", "add_remove", 1.0)
    cases = [(PldAccountant(), {E(0.3, 1.0, "poisson"): 1}), (PldAccountant(), {add_remove: 1}),
             (PldAccountant(), {E(100.0, 1.0, "poisson"): 1}), (PldAccountant(), {E(30.0, 1.0, "poisson"): 2}),
             (PldAccountant(), {E(0.8, 0.5, "poisson", "add_remove", 1.0): 5000}),
             # W within a reference point of a power of 2
             (PldAccountant(), {E(1.0, 0.01, "poisson"): 1472}), (PldAccountant(), {E(1.0, 0.01, "poisson"): 6602}),
             (PldAccountant(1e-2), {add_remove: 7}), (PldAccountant(1e-2), {E(0.3, 1.0, "poisson"): 100}),
             (PldAccountant(1e-3, max_points=256), {E(100.0, 1.0, "poisson"): 1}),
             (PldAccountant(max_points=64), {E(2.0, 0.001, "poisson"): 2}),
             (PldAccountant(), {E(2.0, 0.1, "poisson"): 40, PureDpEvent(0.3): 3, add_remove: 9})]
    for acct, counts in cases:
        assert acct.interval(counts) == rule(acct, counts)
    h0 = 1e-4
    for z in (0.05, 0.0626, 0.3, 1.0, 24.5866, 24.6):
        expected = h0 * 2 ** max(0, math.ceil(math.log2(2 * (20 / z + 2 / z**2) / h0 / 2**14)))
        assert PldAccountant()._width_model(E(z, 0.5, "poisson"))[0] == expected


def test_pld_builds_long_compositions_in_two_levels_only_beyond_2_blocks():
    """Up to 2 * BLOCKS releases, or when the block's own grid is not finer than h, one FFT
    self-composition; beyond, a block of n // BLOCKS on its finer grid moved onto h by ``rebin``
    (and the remainder likewise), which stays an upper bound and tightens the coarse-grid error."""
    acct = PldAccountant()
    u = E(1.0, 1.0, "poisson")
    calls = []

    def spy(*args):
        calls.append(args)
        return rebin(*args)

    mp = pytest.MonkeyPatch()
    mp.setattr(pld_module, "rebin", spy)
    try:
        h = 0.1024  # four times the blocks' own grid (0.0256 for 2 or 3 releases)
        for n, expected in [(512, 0), (513, 2), (700, 2), (768, 1), (1000, 2)]:
            calls.clear()
            sides = acct._sides(u, h)
            lower, probs, _ = acct._compose_side(u, sides, 0, n, h)
            assert len(calls) == expected, n
            if expected:
                exact = gaussian_epsilon(1.0 / 2 / math.sqrt(n), DELTA)
                one = sides[0].self_compose(n)
                eps_two, eps_one = (pmf_epsilon(lo, p, h, m, DELTA) for lo, p, m in ((lower, probs, _), one))
                assert exact <= eps_two < eps_one
        calls.clear()
        n = 600
        h = acct.interval({u: n // pld_module.BLOCKS})  # the block's own grid is h: one level
        np.testing.assert_array_equal(acct._compose_side(u, acct._sides(u, h), 0, n, h)[1],
                                      acct._sides(u, h)[0].self_compose(n)[1])
        assert not calls
    finally:
        mp.undo()


def test_pld_accounts_more_distinct_events_than_it_keeps_width_models_for():
    """A ledger of 70 distinct pure-DP events (more than the 64 width models kept) is accounted,
    and equals randomized response composed by dp_accounting on the same grid."""
    acct = PldAccountant()
    counts = {PureDpEvent(0.01 + 0.001 * i): 1 for i in range(70)}
    eps = acct.epsilon_at(counts, DELTA)
    h = acct.interval(counts)
    theirs = None
    for unit in counts:
        one = pld_lib.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(unit.epsilon, 0.0),
                                              value_discretization_interval=h)
        theirs = one if theirs is None else theirs.compose(one)
    assert eps == pytest.approx(theirs.get_epsilon_for_delta(DELTA), rel=1e-7)
    assert len(acct._widths) <= 64
