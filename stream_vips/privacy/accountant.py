"""Accountants: epsilon(delta) for any sequence of privacy events, and noise calibration.

Two accountants, each sound only for the combinations it knows (DESIGN rules 3 and 4):

* ``PldAccountant`` (dp_accounting privacy loss distributions): Poisson sampling under
  replace-one (the default pipeline) and under add/remove. Fixed-size sampling is refused:
  dp_accounting has no PLD for sampling without replacement.
* ``RdpAccountant`` (autodp Renyi DP): fixed-size sampling without replacement under
  replace-one, and Poisson sampling under add/remove. Poisson under replace-one is refused:
  autodp's Poisson amplification is for add/remove only.

Both also account ``PureDpEvent`` (a pure epsilon-DP release, no amplification claimed).
Both group a sequence by distinct event (``event.unit()``) in order of first appearance and
compose the groups, so a ledger of 10^5 identical steps costs the same as one event with
``count = 10^5``; per-event curves and distributions are cached. An event an accountant cannot
bound raises ``UnsupportedEvent``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from functools import lru_cache
from typing import Iterable, Mapping

import numpy as np

from .events import PureDpEvent, SubsampledGaussianEvent

Counts = Mapping[SubsampledGaussianEvent, int]


class UnsupportedEvent(ValueError):
    """An event (or sampling/adjacency combination) this accountant cannot bound soundly."""


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


class Accountant(ABC):
    """epsilon(delta) of a composition of events; subclasses say which events they bound."""

    name: str

    @abstractmethod
    def why_unsupported(self, event: object) -> str | None:
        """None if this accountant bounds ``event`` soundly, else the reason it cannot."""

    def supports(self, event: object) -> bool:
        return self.why_unsupported(event) is None

    def cache_key(self) -> tuple | None:
        """Identifies this accountant's answers (type and settings); None disables memoizing."""
        return None

    def check(self, event: object) -> None:
        why = self.why_unsupported(event)
        if why is not None:
            raise UnsupportedEvent(f"the {self.name} accountant cannot account {event!r}: {why}")

    def group(self, events: Iterable[object]) -> "OrderedDict[SubsampledGaussianEvent, int]":
        """Distinct unit events -> total count, in order of first appearance (checked)."""
        counts: OrderedDict[SubsampledGaussianEvent, int] = OrderedDict()
        for event in events:
            self.check(event)
            unit = event.unit()
            counts[unit] = counts.get(unit, 0) + event.count
        return counts

    def epsilon(self, events: Iterable[object], delta: float) -> float:
        """epsilon at ``delta`` of the adaptive composition of ``events``."""
        return self.epsilon_of_counts(self.group(events), delta)

    @abstractmethod
    def epsilon_of_counts(self, counts: Counts, delta: float) -> float:
        """epsilon at ``delta`` of ``count`` compositions of each distinct unit event."""

    def headroom(self, counts: Counts, event: SubsampledGaussianEvent, delta: float, budget: float,
                 limit: int = 2**40) -> int:
        """Largest n <= ``limit`` with epsilon(counts + n copies of ``event``) <= ``budget``.

        Searches over the same ``epsilon_of_counts`` that ``epsilon`` uses, keeping a bracket
        lo < hi with fits(lo) and not fits(hi), so the answer agrees exactly with evaluating
        every prefix (epsilon is non-decreasing in the number of compositions: the composition
        post-processes to each of its prefixes). The bracket grows at least geometrically, aimed
        just past the root of a power law (epsilon(n) is close to c n^a locally) through the
        last two points; it then shrinks by probing the predicted root and its neighbour, which
        gives the local exponent for the next (Newton-like) prediction, with a bisection step
        after two probes that fail to halve it. About 10 evaluations for n ~ 10^5, against 34
        for doubling plus bisection.
        """
        self.check(event)
        unit = event.unit()
        memo: dict[int, float] = {}

        def eps(n: int) -> float:
            if n not in memo:
                trial = OrderedDict(counts)
                trial[unit] = trial.get(unit, 0) + n
                memo[n] = self.epsilon_of_counts(trial, delta)
            return memo[n]

        if eps(1) > budget:
            return 0
        lo, hi, n = 1, None, 2
        while hi is None:  # expand: at least doubling, jumping to just past the predicted root
            n = min(n, limit)
            if eps(n) > budget:
                hi = n
            elif n == limit:
                return limit
            else:
                prev, lo = lo, n
                guess = _power_law_root(prev, eps(prev), lo, eps(lo), budget)
                n = 2 * lo if guess is None else int(min(max(guess * 1.02, 2 * lo), 64 * lo))
        side, stalls = None, 0
        while hi - lo > 1:  # invariant: eps(lo) <= budget < eps(hi)
            width = hi - lo
            # Newton-like: the local power law through the neighbouring pair found by the last
            # probe (lo - 1, lo) or (hi, hi + 1); else the chord through the bracket ends.
            if side == "lo" and lo - 1 in memo:
                pair = (lo - 1, lo)
            elif side == "hi" and hi + 1 in memo:
                pair = (hi, hi + 1)
            else:
                pair = (lo, hi)
            guess = None if stalls >= 2 else _power_law_root(pair[0], eps(pair[0]), pair[1], eps(pair[1]), budget)
            if guess is None:
                m = (lo + hi) // 2
                lo, hi = (m, hi) if eps(m) <= budget else (lo, m)
                side, stalls = None, 0
                continue
            m = min(max(int(guess), lo + 1), hi - 1)
            if eps(m) <= budget:  # probe the predicted root and its neighbour on the far side
                lo, side = m, "lo"
                if m + 1 < hi:
                    lo, hi = (m + 1, hi) if eps(m + 1) <= budget else (lo, m + 1)
            else:
                hi, side = m, "hi"
                if m - 1 > lo:
                    lo, hi = (m - 1, hi) if eps(m - 1) <= budget else (lo, m - 1)
            stalls = stalls + 1 if hi - lo > width / 2 else 0  # two probes without halving: bisect
        return lo


def _power_law_root(n1: int, e1: float, n2: int, e2: float, target: float) -> float | None:
    """n where the power law through (n1, e1), (n2, e2) reaches ``target`` (None if undefined)."""
    if not (0 < e1 < e2 and math.isfinite(e2) and n1 != n2):
        return None
    slope = math.log(e2 / e1) / math.log(n2 / n1)
    log_n = math.log(n1) + math.log(target / e1) / slope
    return math.exp(log_n) if log_n < 60 else None


# ---------------------------------------------------------------------------------------------
# autodp (Renyi DP)

# RDP orders: fractional ones near 1 (large epsilon), every integer up to 64, then geometric.
RDP_ORDERS = np.unique(np.concatenate([
    [1.1, 1.25, 1.5, 1.75], np.arange(2.0, 65.0), np.geomspace(64, 1024, 25).round(1),
]))


def rdp_to_epsilon(rdp: np.ndarray, orders: np.ndarray, delta: float) -> float:
    """Smallest epsilon over ``orders`` by the conversion of Balle et al. (2020, Thm 21).

    For a mechanism that is (alpha, r)-RDP, it is (eps, delta)-DP with
    eps = r + log((alpha - 1) / alpha) - (log(delta) + log(alpha)) / (alpha - 1); every order
    gives a valid bound, so the minimum over a fixed grid is one too (and, being a minimum of
    functions each non-decreasing in r, it is non-decreasing in the composition).
    """
    eps = rdp + np.log((orders - 1) / orders) - (math.log(delta) + np.log(orders)) / (orders - 1)
    return float(max(0.0, np.nanmin(eps)))


class RdpAccountant(Accountant):
    """autodp RDP accountant: fixed-size replace-one (DESIGN rule 3), Poisson add/remove.

    Fixed-size steps use ``ExactGaussianMechanism(sigma)`` with sigma = z / diameter (noise std
    over the replace-one sensitivity diameter * C; z/2 by default), ``neighboring =
    'replace_one'``, amplified by ``AmplificationBySampling(PoissonSampling=False)`` with
    ``improved_bound_flag=True``. Poisson add/remove steps use sigma = z (sensitivity C) and
    Poisson amplification with the improved bound (valid for the Gaussian). q = 1 uses the
    Gaussian's RDP alpha / (2 sigma^2). RDP curves are computed once per distinct event on
    ``RDP_ORDERS`` and summed; epsilon is the grid minimum of the BBGHS conversion, and when
    every event is an unsampled Gaussian (q = 1) the exact analytic Gaussian epsilon of the
    composition (one Gaussian with sigma = (sum_i count_i / sigma_i^2)^(-1/2)) if smaller.
    """

    name = "autodp"

    def __init__(self, orders: np.ndarray = RDP_ORDERS) -> None:
        self.orders = np.asarray(orders, dtype=float)
        self._curves: dict[SubsampledGaussianEvent, np.ndarray] = {}

    def cache_key(self) -> tuple:
        return ("autodp", self.orders.tobytes())

    def why_unsupported(self, event: object) -> str | None:
        if isinstance(event, PureDpEvent):
            return None
        if not isinstance(event, SubsampledGaussianEvent):
            return f"unknown event type {type(event).__name__}"
        if event.sampling == "poisson" and event.adjacency == "replace_one" and event.sampling_rate < 1:
            return ("autodp's Poisson amplification holds for add/remove adjacency only; "
                    "account Poisson replace-one steps with the pld accountant")
        if event.sampling == "fixed" and event.adjacency == "add_remove" and event.sampling_rate < 1:
            return "autodp's amplification without replacement holds for replace-one adjacency only"
        return None

    @staticmethod
    def sigma(event: SubsampledGaussianEvent) -> float:
        """autodp's sigma (noise std / L2 sensitivity) for the event: z / diameter."""
        return event.noise_multiplier / event.diameter

    def curve(self, event: SubsampledGaussianEvent) -> np.ndarray:
        """RDP of one release of ``event`` at ``self.orders`` (cached)."""
        unit = event.unit()
        cached = self._curves.get(unit)
        if cached is not None:
            return cached
        self.check(unit)
        if isinstance(unit, PureDpEvent):
            # pure eps-DP: D_alpha <= D_inf = eps, and eps-DP implies (eps^2 / 2)-zCDP
            # (Bun & Steinke 2016, Prop. 3.3), i.e. RDP(alpha) <= alpha eps^2 / 2.
            rdp = np.minimum(unit.epsilon, 0.5 * self.orders * unit.epsilon**2)
            rdp.setflags(write=False)
            self._curves[unit] = rdp
            return rdp
        sigma, q = self.sigma(unit), unit.sampling_rate
        if q == 1:
            rdp = self.orders / (2 * sigma**2)
        else:
            from autodp.mechanism_zoo import ExactGaussianMechanism
            from autodp.transformer_zoo import AmplificationBySampling

            mech = ExactGaussianMechanism(sigma)
            poisson = unit.sampling == "poisson"
            mech.neighboring = "add_remove" if poisson else "replace_one"
            sub = AmplificationBySampling(PoissonSampling=poisson)(mech, q, improved_bound_flag=True)
            rdp = np.array([sub.RenyiDP(a) for a in self.orders], dtype=float)
        rdp.setflags(write=False)
        self._curves[unit] = rdp
        return rdp

    def epsilon_of_counts(self, counts: Counts, delta: float) -> float:
        _check_delta(delta)
        if not counts:
            return 0.0
        total = np.zeros_like(self.orders)
        for unit, n in counts.items():
            total = total + n * self.curve(unit)
        eps = rdp_to_epsilon(total, self.orders, delta)
        if all(isinstance(u, SubsampledGaussianEvent) and u.sampling_rate == 1 for u in counts):
            precision = sum(n / self.sigma(u) ** 2 for u, n in counts.items())
            eps = min(eps, analytic_gaussian_epsilon(precision**-0.5, delta))
        return eps


@lru_cache(maxsize=4096)
def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact epsilon(delta) of the Gaussian mechanism with noise std / sensitivity ``sigma``."""
    from autodp.dp_bank import get_eps_ana_gaussian

    return float(get_eps_ana_gaussian(sigma, delta))


# ---------------------------------------------------------------------------------------------
# dp_accounting (privacy loss distributions)


class PldAccountant(Accountant):
    """dp_accounting PLD accountant: Poisson replace-one (DESIGN rule 4) and Poisson add/remove.

    Replace-one uses ``NeighboringRelation.REPLACE_ONE``, whose pair of distributions is
    (1-q) N(0, s^2) + q N(-C, s^2) vs (1-q) N(0, s^2) + q N(+C, s^2): the replaced record's
    contribution goes from -C to +C, i.e. diameter 2, and the Gaussian's noise_multiplier is
    s / C = z. This pair is only known to dominate for diameter 2, so an event declaring a
    smaller diameter is accounted conservatively at diameter 2 (still sound, since every
    contribution has norm <= C). Add/remove uses ``ADD_OR_REMOVE_ONE`` with the same z.
    Fixed-size sampling is refused (no PLD for sampling without replacement here).

    PLDs are discretized pessimistically (every reported epsilon is an upper bound) on a grid of
    ``value_discretization_interval`` in privacy loss; the default is dp_accounting's 1e-4. A
    coarser grid is faster but, at large z and many steps, visibly loose (1e-3 overstated
    epsilon by 1.3% at z = 7.5, q = 0.01, T = 10^4 where 1e-4 is within 0.01% of 3e-5).
    """

    name = "pld"

    def __init__(self, value_discretization_interval: float = 1e-4) -> None:
        self.value_discretization_interval = value_discretization_interval
        self._plds: dict = {}
        self._composed: OrderedDict = OrderedDict()

    def cache_key(self) -> tuple:
        return ("pld", self.value_discretization_interval)

    def why_unsupported(self, event: object) -> str | None:
        if isinstance(event, PureDpEvent):
            return None
        if not isinstance(event, SubsampledGaussianEvent):
            return f"unknown event type {type(event).__name__}"
        if event.sampling == "fixed" and event.sampling_rate < 1:
            return ("dp_accounting has no privacy loss distribution for fixed-size sampling "
                    "without replacement; account fixed-size steps with the autodp accountant")
        return None

    def pld(self, event: SubsampledGaussianEvent):
        """The PLD of one release of ``event`` (cached)."""
        unit = event.unit()
        cached = self._plds.get(unit)
        if cached is None and isinstance(unit, PureDpEvent):
            # the dominating pair of every pure eps-DP mechanism (randomized response)
            from dp_accounting.pld import common
            from dp_accounting.pld import privacy_loss_distribution as pld_lib

            cached = pld_lib.from_privacy_parameters(
                common.DifferentialPrivacyParameters(unit.epsilon, 0.0),
                value_discretization_interval=self.value_discretization_interval,
            )
            self._plds[unit] = cached
        if cached is None:
            self.check(unit)
            from dp_accounting import privacy_accountant
            from dp_accounting.pld import privacy_loss_distribution as pld_lib

            rel = privacy_accountant.NeighboringRelation
            cached = pld_lib.from_gaussian_mechanism(
                standard_deviation=unit.noise_multiplier,
                sensitivity=1.0,
                sampling_prob=unit.sampling_rate,
                neighboring_relation=rel.REPLACE_ONE if unit.adjacency == "replace_one" else rel.ADD_OR_REMOVE_ONE,
                value_discretization_interval=self.value_discretization_interval,
            )
            self._plds[unit] = cached
        return cached

    def _self_composed(self, unit: SubsampledGaussianEvent, n: int):
        key = (unit, n)
        out = self._composed.get(key)
        if out is None:
            out = self.pld(unit).self_compose(n) if n > 1 else self.pld(unit)
            self._composed[key] = out
            if len(self._composed) > 16:
                self._composed.popitem(last=False)
        else:
            self._composed.move_to_end(key)
        return out

    def epsilon_of_counts(self, counts: Counts, delta: float) -> float:
        _check_delta(delta)
        composed = None
        for unit, n in counts.items():
            part = self._self_composed(unit, n)
            composed = part if composed is None else composed.compose(part)
        return 0.0 if composed is None else float(max(0.0, composed.get_epsilon_for_delta(delta)))


def make_accountant(name: str, sampling: str) -> Accountant:
    """``"auto"`` (pld for Poisson, autodp for fixed-size), ``"pld"``, ``"autodp"``, or
    ``"strong"`` (Dwork & Roth Theorem 3.20 over per-step bounds from the auto accountant; a
    baseline, see :mod:`stream_vips.privacy.composition`)."""
    if sampling not in ("poisson", "fixed"):
        raise ValueError(f"sampling must be 'poisson' or 'fixed', got {sampling!r}")
    if name == "auto":
        name = "pld" if sampling == "poisson" else "autodp"
    if name == "pld":
        return PldAccountant()
    if name == "autodp":
        return RdpAccountant()
    if name == "strong":
        from .composition import StrongCompositionAccountant

        return StrongCompositionAccountant(make_accountant("auto", sampling))
    raise ValueError(f"accountant must be 'auto', 'pld', 'autodp' or 'strong', got {name!r}")


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
    _check_delta(delta)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not 0 < rtol < 0.5:
        raise ValueError(f"rtol must be in (0, 0.5), got {rtol!r}")
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
            if z < 1e-4:
                raise ValueError(f"epsilon {epsilon} at delta {delta} is met even with noise multiplier "
                                 "1e-4; the target is too loose to calibrate")
            e = eps(z)
            if e > epsilon:
                lo, e_lo = z, e
                break
            hi, e_hi = z, e

    step = 1 + rtol / 3  # two probes g/step, g*step bracket the root within (1 + rtol)
    interpolate = True
    while hi / lo > 1 + rtol:  # invariant: eps(lo) > target >= eps(hi)
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
