"""What the learner and the engine call on a reservoir, per kind, as protocols.

:class:`~stream_vips.core.data.reservoir.ReservoirLike` is what every reservoir offers (size,
fill, validity, candidates, state). A reservoir of records (:class:`Reservoir`,
:class:`WindowReservoir`) is fed arrivals by count and sampled by slot; a reservoir of key slots
(:class:`KeyReservoir`, privacy rule 12) is fed the arrivals' keys and sampled by key slot. Kept
apart from the reservoir modules, whose code is mutation-tested (tools/mutation.py): a new class
there would invalidate their recorded result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeAlias

import numpy as np

from stream_vips.core.data.reservoir import Admission, ReservoirLike


class RecordReservoir(ReservoirLike, Protocol):
    """A reservoir whose slots hold records (``privacy.unit: record``)."""

    def take(self, indices: np.ndarray) -> dict[str, np.ndarray]: ...

    def add_batch(self, rows: Mapping[str, np.ndarray], accepted: np.ndarray | None = None) -> None: ...

    def admit(self, n: int) -> Admission: ...

    def place(self, admission: Admission, rows: Mapping[str, np.ndarray],
              accepted: np.ndarray | None = None) -> None: ...


class KeySlotReservoir(ReservoirLike, Protocol):
    """A reservoir whose slots hold the records of one key each (``privacy.unit: key``)."""

    @property
    def max_records_per_key(self) -> int: ...

    def take_groups(self, slots: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray, int]: ...

    def add_batch(self, rows: Mapping[str, np.ndarray], keys: np.ndarray, accepted: np.ndarray | None = None,
                  has_key: np.ndarray | None = None) -> None: ...

    def admit(self, keys: np.ndarray, has_key: np.ndarray | None = None) -> Admission: ...

    def place(self, admission: Admission, rows: Mapping[str, np.ndarray],
              accepted: np.ndarray | None = None) -> None: ...


#: Any reservoir the learner can be built with (which one follows ``privacy.unit``).
AnyReservoir: TypeAlias = RecordReservoir | KeySlotReservoir
