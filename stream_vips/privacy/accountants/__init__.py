"""Accountants: epsilon(delta) for any sequence of privacy events (calibration: :mod:`stream_vips.privacy.calibration`).

Two accountants, each sound only for the combinations it knows (fixed-size sampling without
replacement goes to autodp's RDP amplification bound, Poisson sampling under replace-one to
dp_accounting's privacy loss distributions; neither is used where its bound is not proven):

* ``PldAccountant`` (dp_accounting privacy loss distributions): Poisson sampling under
  replace-one (the default pipeline) and under add/remove. Fixed-size sampling is refused:
  dp_accounting has no PLD for sampling without replacement.
* ``RdpAccountant`` (autodp Renyi DP): fixed-size sampling without replacement under
  replace-one, and Poisson sampling under add/remove. Poisson under replace-one is refused:
  autodp's Poisson amplification is for add/remove only.

Both also account ``PureDpEvent`` (a pure epsilon-DP release, no amplification claimed).
Both group a sequence by distinct event (``event.unit()``) in order of first appearance and
compose the groups, so a ledger of 10^5 identical steps costs the same as one event with
``count = 10^5``. Time and memory per evaluation are bounded whatever the number of steps: RDP
curves are a fixed-length vector per event; the PLD accountant reports an upper bound exact at a
grid of counts, on a discretization interval that follows epsilon (see ``PldAccountant``). An
event an accountant cannot bound raises ``UnsupportedEvent``.
"""

from stream_vips.privacy.accountants.base import MIN_NOISE_MULTIPLIER, Accountant, Counts, UnsupportedEvent, check_delta
from stream_vips.privacy.accountants.pld import (
    BLOCKS,
    GRID_EXACT_COUNTS,
    GRID_RATIO,
    TAIL_MASS,
    PldAccountant,
    grid_count,
    pmf_epsilon,
    rebin,
)
from stream_vips.privacy.accountants.rdp import RDP_ORDERS, RdpAccountant, analytic_gaussian_epsilon, rdp_to_epsilon
from stream_vips.privacy.accountants.registry import make_accountant
from stream_vips.privacy.accountants.strong import (
    StrongCompositionAccountant,
    heterogeneous_strong_epsilon,
    strong_composition_epsilon,
)

__all__ = [
    "BLOCKS", "GRID_EXACT_COUNTS", "GRID_RATIO", "MIN_NOISE_MULTIPLIER", "RDP_ORDERS", "TAIL_MASS", "Accountant",
    "Counts", "PldAccountant", "RdpAccountant", "StrongCompositionAccountant", "UnsupportedEvent",
    "analytic_gaussian_epsilon", "check_delta", "grid_count", "heterogeneous_strong_epsilon", "make_accountant",
    "pmf_epsilon", "rdp_to_epsilon", "rebin", "strong_composition_epsilon",
]
