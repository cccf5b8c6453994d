"""Strong (advanced) composition: the VIPS paper's accounting baseline (section 4.3).

Dwork & Roth (2014), Theorem 3.20: k adaptive releases, each (eps0, delta0)-DP, are
(eps', k delta0 + delta')-DP for every slack delta' > 0 with

    eps' = sqrt(2 k ln(1 / delta')) eps0 + k eps0 (e^eps0 - 1).

For releases with different eps_i the same argument (Kairouz, Oh & Viswanath 2015, Theorem 3.5,
whose middle term sum eps_i (e^eps_i - 1) / (e^eps_i + 1) is smaller still) gives

    eps' = sqrt(2 ln(1 / delta') sum_i eps_i^2) + sum_i eps_i (e^eps_i - 1),  delta = delta' + sum_i delta_i,

which is Theorem 3.20 when all eps_i are equal (:func:`strong_composition_epsilon`).

Per-step bound. The VIPS paper composes a per-iteration (eps', delta') of the subsampled
Gaussian. Here each step's (eps0, delta0) is the exact one-step epsilon at delta0 of the
project's own accountant for that event (PLD for Poisson, autodp RDP for fixed-size sampling:
amplification by subsampling included), so a comparison against the moments accountant
isolates the composition theorem. Pure eps-DP events (:class:`PureDpEvent`) enter with
(eps, 0).

Splitting delta. Of the total delta, a fraction f is the slack delta' and the rest is shared
equally by the approximate-DP steps (delta0 = (1 - f) delta / k). Every f gives a valid bound,
so the minimum over the fixed grid :data:`SLACK_FRACTIONS` is one too; so is basic composition
(sum eps_i at delta = sum delta_i), which wins for few steps. Each of these is non-decreasing in
the number of steps, hence so is their minimum (which the budget monitor's headroom search
relies on).

>>> round(strong_composition_epsilon(0.01, 1000, 1e-5), 4)
1.6179
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from stream_vips.privacy.accountants.base import Accountant, Counts
from stream_vips.privacy.event_types import Event
from stream_vips.privacy.events import PureDpEvent

#: Fractions of the total delta tried as the slack delta' of Theorem 3.20.
SLACK_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)


def strong_composition_epsilon(eps0: float, k: int, delta_slack: float) -> float:
    """Theorem 3.20's eps' for ``k`` releases of an (eps0, .)-DP mechanism and slack delta'."""
    if not (eps0 >= 0 and math.isfinite(eps0)):
        raise ValueError(f"eps0 must be finite and >= 0, got {eps0!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")
    if not 0 < delta_slack < 1:
        raise ValueError(f"delta_slack must be in (0, 1), got {delta_slack!r}")
    return math.sqrt(2.0 * k * math.log(1.0 / delta_slack)) * eps0 + k * eps0 * math.expm1(eps0)


def heterogeneous_strong_epsilon(eps_counts: Mapping[float, int], delta_slack: float) -> float:
    """eps' for ``n`` releases at each per-step epsilon (``{eps_i: n_i}``) and slack delta'."""
    if not 0 < delta_slack < 1:
        raise ValueError(f"delta_slack must be in (0, 1), got {delta_slack!r}")
    sq = sum(n * e * e for e, n in eps_counts.items())
    drift = sum(n * e * math.expm1(e) for e, n in eps_counts.items())
    return math.sqrt(2.0 * math.log(1.0 / delta_slack) * sq) + drift


class StrongCompositionAccountant(Accountant):
    """epsilon(delta) by strong composition of per-step bounds from ``per_step`` (a baseline).

    Supports exactly the events ``per_step`` supports (plus pure-DP events, which need no
    per-step accountant). Per-step epsilons are cached per (event, delta0).
    """

    name = "strong"

    def __init__(self, per_step: Accountant, slack_fractions: tuple[float, ...] = SLACK_FRACTIONS) -> None:
        if not slack_fractions or not all(0 < f < 1 for f in slack_fractions):
            raise ValueError(f"slack_fractions must be non-empty, each in (0, 1), got {slack_fractions!r}")
        self.per_step = per_step
        self.slack_fractions = tuple(float(f) for f in slack_fractions)
        self._step_eps: dict = {}

    def why_unsupported(self, event: object) -> str | None:
        if isinstance(event, PureDpEvent):
            return None
        return self.per_step.why_unsupported(event)

    def step_epsilon(self, unit: Event, delta0: float) -> float:
        """(eps0 at ``delta0``) of one release of ``unit``; pure events return their epsilon."""
        if isinstance(unit, PureDpEvent):
            return unit.epsilon
        key = (unit, delta0)
        eps = self._step_eps.get(key)
        if eps is None:
            eps = self.per_step.epsilon_of_counts({unit: 1}, delta0)
            self._step_eps[key] = eps
            if len(self._step_eps) > 4096:
                self._step_eps.clear()
        return eps

    def epsilon_of_counts(self, counts: Counts, delta: float) -> float:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if not counts:
            return 0.0
        k_approx = sum(n for u, n in counts.items() if not isinstance(u, PureDpEvent))
        best = math.inf
        for f in self.slack_fractions:
            slack = f * delta
            delta0 = (delta - slack) / k_approx if k_approx else 0.0
            eps_counts: dict[float, int] = {}
            for unit, n in counts.items():
                e = self.step_epsilon(unit, delta0)
                eps_counts[e] = eps_counts.get(e, 0) + n
            basic = sum(e * n for e, n in eps_counts.items())
            best = min(best, basic, heterogeneous_strong_epsilon(eps_counts, slack))
        return float(best)
