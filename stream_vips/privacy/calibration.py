"""Noise calibration: the smallest noise multiplier z whose planned steps spend at most a
target epsilon, found by a safeguarded search on the accountant's own epsilon."""

from __future__ import annotations

import math

from stream_vips.privacy.accountants.base import MIN_NOISE_MULTIPLIER, Accountant, check_delta
from stream_vips.privacy.accountants.registry import make_accountant
from stream_vips.privacy.events import SubsampledGaussianEvent

#: Smallest relative tolerance :func:`calibrate_noise_multiplier` accepts. Doubles are spaced
#: 2.2e-16 apart relative to their value, so below about that a bracket lo < hi cannot narrow to
#: hi / lo <= 1 + rtol (sqrt(lo * hi) rounds to lo or hi) and the search would never end; the floor
#: keeps four orders of magnitude of margin above that spacing.
MIN_CALIBRATION_RTOL = 1e-12


def calibrate_noise_multiplier(
    epsilon: float,
    delta: float,
    q: float,
    steps: int,
    sampling: str,
    adjacency: str = "replace_one",
    accountant: Accountant | None = None,
    diameter: float = 2.0,
    rtol: float = 1e-3,
) -> float:
    """Smallest noise multiplier z (to relative ``rtol``) with epsilon(z) <= ``epsilon``.

    Keeps a bracket lo < hi with epsilon(lo) > target >= epsilon(hi) on the accountant's own
    epsilon and returns hi once hi / lo <= 1 + rtol: epsilon(z) <= target is guaranteed (never
    the small overshoot of autodp's calibrators) and epsilon(z / (1 + rtol)) > target. The
    bracket is found by doubling/halving from a rule-of-thumb start and narrowed by probing below and
    above the log-log interpolated root (epsilon is close to a power law in z), falling back to
    bisection, so a calibration costs about half the evaluations of plain bisection. Results
    are memoized per process (keyed by the accountant's ``cache_key`` and every argument).
    """
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"target epsilon must be finite and > 0, got {epsilon!r}")
    check_delta(delta)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not MIN_CALIBRATION_RTOL <= rtol < 0.5:
        raise ValueError(f"the calibration tolerance rtol must be in [{MIN_CALIBRATION_RTOL:g}, 0.5) (below that "
                         f"it is finer than double precision), got {rtol!r}")
    acct = accountant if accountant is not None else make_accountant("auto", sampling)
    if adjacency == "add_remove":
        diameter = 1.0
    acct.check(SubsampledGaussianEvent(1.0, q, sampling, adjacency, diameter, count=steps))
    key = acct.cache_key()
    if key is not None:
        key = (key, float(epsilon), float(delta), float(q), steps, sampling, adjacency, float(diameter), float(rtol))
        if key in _CALIBRATED:
            return _CALIBRATED[key]

    def eps(z: float) -> float:
        return acct.epsilon([SubsampledGaussianEvent(z, q, sampling, adjacency, diameter, count=steps)], delta)

    # Start near the moments-accountant scale z ~ 2 q sqrt(T log(1/delta)) / epsilon (sigma = z/2):
    # small z are the expensive evaluations (wide privacy loss distributions).
    z = min(max(2 * q * math.sqrt(steps * math.log(1 / delta)) / epsilon, 0.5), 1e5)
    e = eps(z)
    if e > epsilon:
        lo, e_lo = z, e
        while True:
            z *= 2
            if z > 1e6:
                raise ValueError(f"epsilon {epsilon} at delta {delta} needs a noise multiplier above 1e6")
            e = eps(z)
            if e <= epsilon:
                hi, e_hi = z, e
                break
            lo, e_lo = z, e
    else:
        hi, e_hi = z, e
        while True:
            z /= 2
            if z < MIN_NOISE_MULTIPLIER:
                raise ValueError(f"epsilon {epsilon} at delta {delta} is met even with noise multiplier "
                                 f"{MIN_NOISE_MULTIPLIER:g}; the target is too loose to calibrate")
            e = eps(z)
            if e > epsilon:
                lo, e_lo = z, e
                break
            hi, e_hi = z, e

    step = 1 + rtol / 3  # two probes g/step, g*step bracket the root within (1 + rtol)
    interpolate = True
    # Iteration cap: a bisection step halves ln(hi / lo), so ceil(log2(ln(hi / lo) / ln(1 + rtol)))
    # of them end the loop; an interpolation step either ends it (its probes bracket the root within
    # step^2 < 1 + rtol) or is followed by a bisection, so at most twice that many passes, plus slack.
    # With rtol >= MIN_CALIBRATION_RTOL and hi / lo <= 2 this is at most 2 * 40 + 4 passes.
    passes_left = 2 * math.ceil(math.log2(math.log(hi / lo) / math.log1p(rtol))) + 4
    while hi / lo > 1 + rtol:  # invariant: eps(lo) > target >= eps(hi)
        passes_left -= 1
        if passes_left < 0:
            raise ValueError(f"the noise calibration did not narrow to the tolerance rtol {rtol!r}")
        g = math.sqrt(lo * hi)
        if interpolate and e_hi > 0:
            t = math.log(e_lo / epsilon) / math.log(e_lo / e_hi)
            g = lo * (hi / lo) ** t
        if not (interpolate and lo < g / step and g * step < hi):
            g = math.sqrt(lo * hi)  # bisection step
            e = eps(g)
            if e > epsilon:
                lo, e_lo = g, e
            else:
                hi, e_hi = g, e
            interpolate = True
            continue
        a, b = g / step, g * step
        e = eps(a)
        if e <= epsilon:
            hi, e_hi = a, e
        else:
            lo, e_lo = a, e
            e = eps(b)
            if e <= epsilon:
                hi, e_hi = b, e
            else:
                lo, e_lo = b, e
        interpolate = False  # if the probes missed the root, bisect once before interpolating again
    if key is not None:
        _CALIBRATED[key] = hi
    return hi


_CALIBRATED: dict[tuple, float] = {}
