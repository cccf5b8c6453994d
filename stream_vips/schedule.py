"""When updates happen and how far each one moves: the Robbins-Monro step and the update trigger.

>>> round(step_size(1, tau0=0.0, kappa=1.0), 3), round(step_size(0, tau0=100.0, kappa=0.7), 4)
(1.0, 0.0398)
"""

from __future__ import annotations

import math
import numbers
import time


def step_size(t: int, tau0: float, kappa: float) -> float:
    """rho_t = (tau0 + t) ** -kappa.

    ``kappa`` in (0.5, 1] makes sum rho_t diverge and sum rho_t^2 converge (the Robbins-Monro
    conditions); ``tau0 >= 0`` damps early steps. ``tau0 + t >= 1`` keeps rho_t <= 1 so every
    step is a convex combination of the old and the new natural parameters.
    """
    if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
        raise ValueError(f"step index t must be a non-negative integer, got {t!r}")
    if not (math.isfinite(tau0) and tau0 >= 0):
        raise ValueError(f"schedule.tau0 must be a finite number >= 0, got {tau0!r}")
    if not (0.5 < kappa <= 1.0):
        raise ValueError(f"schedule.kappa must be in (0.5, 1], got {kappa!r}")
    if tau0 + t < 1:
        raise ValueError(f"tau0 + t = {tau0 + t} < 1 would give a step size above 1")
    return float((tau0 + t) ** -kappa)


class Trigger:
    """Fires an update every ``every_records`` accepted records and/or every ``every_seconds``.

    Times are from a monotonic clock (``time.monotonic`` unless the caller passes ``now``).
    Whichever condition is met first fires; :meth:`reset` starts the next period.
    """

    def __init__(
        self,
        every_records: int | None = None,
        every_seconds: float | None = None,
        now: float | None = None,
    ) -> None:
        if every_records is None and every_seconds is None:
            raise ValueError("schedule needs every_records and/or every_seconds")
        if every_records is not None and (
            isinstance(every_records, bool)
            or not isinstance(every_records, numbers.Integral)
            or every_records < 1
        ):
            raise ValueError(f"schedule.every_records must be a positive integer, got {every_records!r}")
        if every_seconds is not None and not (math.isfinite(every_seconds) and every_seconds > 0):
            raise ValueError(f"schedule.every_seconds must be a positive number, got {every_seconds!r}")
        self.every_records = every_records
        self.every_seconds = every_seconds
        self.pending = 0
        self._since = time.monotonic() if now is None else float(now)

    def observe(self, n_accepted: int) -> None:
        """Count records accepted into the reservoir since the last update."""
        if n_accepted < 0:
            raise ValueError("accepted record count cannot be negative")
        self.pending += int(n_accepted)

    def due(self, now: float | None = None) -> bool:
        """True when an update should run now."""
        if self.every_records is not None and self.pending >= self.every_records:
            return True
        if self.every_seconds is not None:
            now = time.monotonic() if now is None else now
            return now - self._since >= self.every_seconds
        return False

    def reset(self, now: float | None = None) -> None:
        """Start a new period after an update."""
        self.pending = 0
        self._since = time.monotonic() if now is None else float(now)
