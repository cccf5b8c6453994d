"""The types of privacy events, for annotations: every event a ledger records and an accountant reads.

Kept apart from :mod:`stream_vips.privacy.events`, whose code is mutation-tested: a type alias there
would be a new statement, which invalidates its recorded mutation result (tools/mutation.py).
"""

from __future__ import annotations

from typing import TypeAlias

from stream_vips.privacy.events import PureDpEvent, SubsampledGaussianEvent, UncertifiedEvent

#: Any privacy event (``event_from_dict`` rebuilds one of these from a ledger line).
Event: TypeAlias = SubsampledGaussianEvent | PureDpEvent | UncertifiedEvent
#: The class of an event (``EVENT_TYPES`` maps each ``TYPE`` to one).
EventClass: TypeAlias = type[SubsampledGaussianEvent] | type[PureDpEvent] | type[UncertifiedEvent]
