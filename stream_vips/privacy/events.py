"""Privacy events: what one release did, in a form any accountant can read.

Events are small frozen dataclasses with a stable, versioned JSON form, because ledgers outlive
code (the dp_accounting ``DpEvent`` discipline; the event contract is in docs/architecture.md,
"Privacy events"). Fields are never removed and their meaning never changes; a new mechanism
gets a new event class. ``event_from_dict`` refuses a type or version it does not know rather
than guessing.

Every event class says whether a proof backs it (``certified``). An
:class:`UncertifiedEvent` records a release whose stated guarantee needs an assumption the
implementation does not meet; no accountant bounds it, so the budget monitor refuses it
(privacy rule 10 in docs/privacy.md).

>>> e = SubsampledGaussianEvent(noise_multiplier=1.2, sampling_rate=0.1, sampling="poisson")
>>> event_from_dict(e.to_dict()) == e
True
>>> e.to_dict()["type"], e.to_dict()["version"]
('subsampled_gaussian', 1)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from stream_vips.errors import StreamVipsError

SAMPLINGS = ("poisson", "fixed")
ADJACENCIES = ("replace_one", "add_remove")
PRIVACY_UNITS = ("record", "key")


class UnknownEvent(StreamVipsError, ValueError):
    """A serialized event whose type, version or fields this code does not know."""


@dataclass(frozen=True)
class SubsampledGaussianEvent:
    """``count`` compositions of a subsampled Gaussian mechanism on a sum.

    Mathematics (everything an accountant needs):

    * A batch B is drawn from a population of M records (the full reservoir). ``sampling`` is
      ``"poisson"`` (each record joins B independently with probability q) or ``"fixed"``
      (B is a uniformly random subset of size S = q*M, without replacement, drawn afresh each
      step). q = ``sampling_rate`` in (0, 1]; q = 1 is the plain Gaussian mechanism on all M.
    * Each record i contributes a vector c_i with ||c_i||_2 <= C. The release is
      sum_{i in B} c_i + N(0, (z*C)^2 I) with z = ``noise_multiplier`` (z = noise std / C;
      privacy rule 2 in docs/privacy.md). Any public normalisation afterwards is post-processing.
    * ``adjacency`` is ``"replace_one"`` (one record's content changes; M and arrival order are
      fixed; privacy rule 1 in docs/privacy.md) or ``"add_remove"`` (one record is added or
      removed).
    * ``diameter`` is the L2 sensitivity of the sum in units of C: under replace-one
      ||c_i - c_i'|| <= diameter * C, at most 2 (a model may prove less, e.g. sqrt(2) for
      non-negative contributions); under add/remove it is 1 (the record's own contribution).
      So the paper's sigma (noise std / sensitivity) is z / diameter.
    * The event stands for ``count`` such releases in sequence (adaptive composition).
    * ``privacy_unit`` is what one "record" above is: ``"record"`` (privacy rule 1) or ``"key"``
      (all records of one key summed and clipped together, privacy rule 12). Its epsilon holds
      for that unit only, so a ledger of record-unit steps cannot be continued at key level.
    """

    noise_multiplier: float
    sampling_rate: float
    sampling: str
    adjacency: str = "replace_one"
    diameter: float = 2.0
    count: int = 1
    privacy_unit: str = "record"

    TYPE: ClassVar[str] = "subsampled_gaussian"
    VERSION: ClassVar[int] = 1
    #: A proof backs the event (the subsampled Gaussian mechanism's accounting).
    certified: ClassVar[bool] = True

    def __post_init__(self) -> None:
        z, q, d = self.noise_multiplier, self.sampling_rate, self.diameter
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z <= 0:
            raise ValueError(f"noise_multiplier must be a finite number > 0, got {z!r}")
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
            raise ValueError(f"sampling_rate must be in (0, 1], got {q!r}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if self.adjacency not in ADJACENCIES:
            raise ValueError(f"adjacency must be one of {ADJACENCIES}, got {self.adjacency!r}")
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d):
            raise ValueError(f"diameter must be a finite number, got {d!r}")
        if self.adjacency == "replace_one" and not 0 < d <= 2:
            raise ValueError(
                f"diameter must be in (0, 2] under replace_one (contributions have norm <= C), got {d!r}"
            )
        if self.adjacency == "add_remove" and d != 1:
            raise ValueError(f"diameter must be 1 under add_remove, got {d!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count must be an integer >= 1, got {self.count!r}")
        if self.privacy_unit not in PRIVACY_UNITS:
            raise ValueError(f"privacy_unit must be one of {PRIVACY_UNITS}, got {self.privacy_unit!r}")
        # Canonical float fields, so equal events hash equally whatever numeric type came in.
        object.__setattr__(self, "noise_multiplier", float(z))
        object.__setattr__(self, "sampling_rate", float(q))
        object.__setattr__(self, "diameter", float(d))

    @property
    def paper_sigma(self) -> float:
        """Noise std over the L2 sensitivity (the VIPS paper's sigma): z / diameter."""
        return self.noise_multiplier / self.diameter

    def unit(self) -> SubsampledGaussianEvent:
        """The same mechanism with ``count = 1`` (the key accountants cache on)."""
        return self if self.count == 1 else dataclasses.replace(self, count=1)

    def with_count(self, count: int) -> SubsampledGaussianEvent:
        return dataclasses.replace(self, count=count)

    def to_dict(self) -> dict[str, Any]:
        """Plain fields; ``privacy_unit`` only when it is ``"key"`` (so record-level lines read the
        same as before the field existed)."""
        out: dict[str, Any] = {"type": self.TYPE, "version": self.VERSION}
        out.update(dataclasses.asdict(self))
        if self.privacy_unit == "record":
            del out["privacy_unit"]
        return out


@dataclass(frozen=True)
class PureDpEvent:
    """``count`` compositions of a mechanism that is pure ``epsilon``-DP (delta = 0).

    Mathematics: for every pair of neighbouring inputs under ``adjacency`` (replace-one by
    default: one record's content changes) and every set O of outputs,
    P[M(D) in O] <= exp(epsilon) P[M(D') in O]. Nothing else about the mechanism is assumed, so
    an accountant must use a bound that holds for every such mechanism (e.g. the dominating
    pair of randomized response, or RDP(alpha) <= min(epsilon, alpha epsilon^2 / 2)). The
    exponential mechanism (e.g. the one-posterior-sample estimator OPS, "Privacy for free",
    ICML 2015, Theorem 1) on an *exact* sample is the intended use; the event is whatever the
    mechanism's proof states, with no subsampling amplification claimed. A release that only
    approximates the mechanism (e.g. the end of an MCMC chain with no bound on its distance to
    the target) is not pure DP and must be an :class:`UncertifiedEvent` instead.
    """

    epsilon: float
    adjacency: str = "replace_one"
    count: int = 1

    TYPE: ClassVar[str] = "pure_dp"
    VERSION: ClassVar[int] = 1
    #: The mechanism's proof is assumed to hold for what ran (the creator's responsibility).
    certified: ClassVar[bool] = True

    def __post_init__(self) -> None:
        e = self.epsilon
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e <= 0:
            raise ValueError(f"epsilon must be a finite number > 0, got {e!r}")
        if self.adjacency not in ADJACENCIES:
            raise ValueError(f"adjacency must be one of {ADJACENCIES}, got {self.adjacency!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count must be an integer >= 1, got {self.count!r}")
        object.__setattr__(self, "epsilon", float(e))

    def unit(self) -> PureDpEvent:
        return self if self.count == 1 else dataclasses.replace(self, count=1)

    def with_count(self, count: int) -> PureDpEvent:
        return dataclasses.replace(self, count=count)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE, "version": self.VERSION}
        out.update(dataclasses.asdict(self))
        return out


@dataclass(frozen=True)
class UncertifiedEvent:
    """``count`` releases whose privacy guarantee is not proven for what actually ran.

    ``mechanism`` names the release, ``nominal_epsilon`` is the pure epsilon its paper's theorem
    would give, and ``reason`` states the assumption of that theorem the implementation does
    not meet (OPS: Theorem 1 needs an exact posterior sample, the release is the end of a
    Metropolis chain whose distance to the target is not bounded). There is no (epsilon, delta)
    to account: every accountant refuses the event (``UnsupportedEvent``; it is not a
    ``SubsampledGaussianEvent`` or ``PureDpEvent``), so a budget monitor raises before anything
    is appended or released. The type exists so that the refusal names the reason, so that an
    explicit opt-in (e.g. :class:`stream_vips.models.baselines.ops.AssumeExactSampling` in
    tests and the baseline harness) can account it under a stated assumption, and so that a
    ledger written under such an opt-in stays readable and is still refused by a plain accountant.
    """

    mechanism: str
    nominal_epsilon: float
    reason: str
    adjacency: str = "replace_one"
    count: int = 1

    TYPE: ClassVar[str] = "uncertified"
    VERSION: ClassVar[int] = 1
    #: No proof covers the release: accountants must refuse it.
    certified: ClassVar[bool] = False

    def __post_init__(self) -> None:
        e = self.nominal_epsilon
        if not isinstance(self.mechanism, str) or not self.mechanism:
            raise ValueError(f"mechanism must be a non-empty string, got {self.mechanism!r}")
        if not isinstance(self.reason, str) or not self.reason:
            raise ValueError(f"reason must be a non-empty string, got {self.reason!r}")
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e <= 0:
            raise ValueError(f"nominal_epsilon must be a finite number > 0, got {e!r}")
        if self.adjacency not in ADJACENCIES:
            raise ValueError(f"adjacency must be one of {ADJACENCIES}, got {self.adjacency!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count must be an integer >= 1, got {self.count!r}")
        object.__setattr__(self, "nominal_epsilon", float(e))

    def unit(self) -> UncertifiedEvent:
        return self if self.count == 1 else dataclasses.replace(self, count=1)

    def with_count(self, count: int) -> UncertifiedEvent:
        return dataclasses.replace(self, count=count)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.TYPE, "version": self.VERSION}
        out.update(dataclasses.asdict(self))
        return out


#: event classes by ``TYPE``; looked up with whatever JSON value a ledger line's ``type`` holds (an
#: unknown one is refused), so the key type is that of a JSON value
EVENT_TYPES: Mapping[Any, type[SubsampledGaussianEvent] | type[PureDpEvent] | type[UncertifiedEvent]] = {
    cls.TYPE: cls for cls in (SubsampledGaussianEvent, PureDpEvent, UncertifiedEvent)
}


def event_from_dict(data: Mapping[str, Any]) -> SubsampledGaussianEvent | PureDpEvent | UncertifiedEvent:
    """Rebuild an event from ``to_dict`` output; refuses unknown types, versions and fields."""
    if not isinstance(data, Mapping):
        raise UnknownEvent(f"an event must be a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        raise UnknownEvent(f"unknown event type {kind!r}; known: {sorted(EVENT_TYPES)}")
    if data.get("version") != cls.VERSION:
        raise UnknownEvent(
            f"event type {kind!r} version {data.get('version')!r} is not supported (knows {cls.VERSION})"
        )
    fields = {k: v for k, v in data.items() if k not in ("type", "version")}
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(fields) - names
    if extra:
        raise UnknownEvent(f"event type {kind!r} has unknown fields {sorted(extra)}")
    try:
        return cls(**fields)
    except TypeError as exc:  # missing required field
        raise UnknownEvent(f"event type {kind!r}: {exc}") from exc
