"""The accountant a configuration names: ``auto`` (pld for Poisson, autodp for fixed-size),
``pld``, ``autodp`` or ``strong`` (a baseline)."""

from __future__ import annotations

from stream_vips.privacy.accountants.base import Accountant
from stream_vips.privacy.accountants.pld import PldAccountant
from stream_vips.privacy.accountants.rdp import RdpAccountant
from stream_vips.privacy.accountants.strong import StrongCompositionAccountant


def make_accountant(name: str, sampling: str) -> Accountant:
    """``"auto"`` (pld for Poisson, autodp for fixed-size), ``"pld"``, ``"autodp"``, or
    ``"strong"`` (Dwork & Roth Theorem 3.20 over per-step bounds from the auto accountant; a
    baseline, see :mod:`stream_vips.privacy.accountants.strong`)."""
    if sampling not in ("poisson", "fixed"):
        raise ValueError(f"sampling must be 'poisson' or 'fixed', got {sampling!r}")
    if name == "auto":
        name = "pld" if sampling == "poisson" else "autodp"
    if name == "pld":
        return PldAccountant()
    if name == "autodp":
        return RdpAccountant()
    if name == "strong":
        return StrongCompositionAccountant(make_accountant("auto", sampling))
    raise ValueError(f"accountant must be 'auto', 'pld', 'autodp' or 'strong', got {name!r}")
