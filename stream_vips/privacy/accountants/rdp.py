"""autodp's Renyi DP accountant: fixed-size sampling without replacement under replace-one,
and Poisson sampling under add/remove (autodp's Poisson amplification is for add/remove only)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from stream_vips.privacy.accountants.base import Accountant, Counts, check_delta
from stream_vips.privacy.events import PureDpEvent, SubsampledGaussianEvent

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
    """autodp RDP accountant: fixed-size replace-one, Poisson add/remove.

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
        check_delta(delta)
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
