"""Empirical privacy audit: distinguish neighbouring releases and bound epsilon from below.

- :mod:`.stats`: threshold tests, Clopper-Pearson bounds and the empirical epsilon lower bound
  from any two sets of releases (:func:`audit_samples`).
- :mod:`.release`: release functions; :class:`EngineTrials` produces releases of one
  neighbouring side through the real :class:`~stream_vips.core.engine.PrivateEngine`.
- :mod:`.families`: the pair, sampler and noise of each registered family's audit, and a
  deliberately broken variant (:func:`halve_bounds`) that the audit must catch.

See docs/audit.md for what an audit shows and what it cannot.
"""

from stream_vips.audit.release import EngineTrials, ReleaseFunction, claimed_epsilon, flatten
from stream_vips.audit.stats import AuditResult, audit_samples, clopper_pearson_upper, epsilon_lower_bound

__all__ = ["AuditResult", "EngineTrials", "ReleaseFunction", "audit_samples", "claimed_epsilon",
           "clopper_pearson_upper", "epsilon_lower_bound", "flatten"]
