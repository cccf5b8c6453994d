"""The rebalance vocabulary both client libraries' sides share: :class:`Rebalance`, the hooks a
consumer client calls when the group's assignment changes (the source implements them), and
:func:`partitions_lost`, what an eviction leaves to do.

It sits below both sides (:mod:`connectors.kafka.kafka_python`, :mod:`connectors.kafka.confluent`)
and imports neither, nor the seam above them (:mod:`connectors.kafka.clients`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from connectors.kafka.connection import log

TP = tuple  # (topic, partition)


class Rebalance(Protocol):
    """What a consumer client calls when the group's assignment changes (the source's hooks)."""

    def revoking(self, revoked: set[TP]) -> dict[TP, int]: ...

    def revoke_committed(self, offsets: Mapping[TP, int]) -> None: ...

    def assigned(self, assigned: set[TP]) -> dict[TP, int]: ...

    @property
    def halted(self) -> bool: ...

    #: How long the revocation commit may take, in milliseconds (the kafka-python side's bound).
    commit_timeout_ms: int


def partitions_lost(lost: Iterable[Any]) -> None:
    """Evicted from the group (no poll or heartbeat in time): the partitions already have new
    owners, which resume from the last commit, so there is nothing left to commit here."""
    log.warning("partitions lost to an eviction (records since the last commit are consumed again): %s",
                sorted(f"{tp[0]}/{tp[1]}" for tp in lost))
