"""A sharded runtime: shards own the records, one driver owns the privacy wall (privacy rule 14).

``runtime.shards: N`` splits the reservoir into N public slices, one per shard; shard i owns
the input partitions p with p mod N = i. ``runtime.engine: ray`` runs the shards as Ray actors
(:class:`~stream_vips.distributed.pool.RayPool`), ``local`` in this process
(:class:`~stream_vips.distributed.pool.LocalPool`). The driver
(:class:`~stream_vips.distributed.driver.ShardedLearner`) samples through the shards, adds up
their clipped sums and releases through the one-process engine: same q, M, C and z, so the same
ledger event and the same epsilon. The core, the models and privacy never import Ray.
"""

from __future__ import annotations

from stream_vips.config import Config
from stream_vips.distributed.driver import PHASES, PublishFailed, ShardedLearner, check, window_length
from stream_vips.distributed.pool import LocalPool, RayPool, ShardFailure, ShardPool
from stream_vips.distributed.shard import (
    DeadLetterUndelivered,
    Plan,
    Shard,
    ShardContribution,
    ShardStatus,
    SourceFailed,
    capacities,
    owned_partitions,
)

__all__ = ["PHASES", "DeadLetterUndelivered", "LocalPool", "Plan", "PublishFailed", "RayPool", "Shard",
           "ShardContribution", "ShardFailure", "ShardPool", "ShardStatus", "ShardedLearner", "SourceFailed",
           "capacities", "check", "make_pool", "owned_partitions", "window_length"]


def make_pool(cfg: Config, **options: object) -> ShardPool:
    """The pool ``runtime.engine`` names, with ``runtime.shards`` shards (``options``: the
    pool's factories of sources and dead-letter sinks)."""
    check(cfg)
    if cfg.runtime.engine == "ray":
        return RayPool(cfg, cfg.runtime.shards, **options)  # type: ignore[arg-type]
    return LocalPool(cfg, cfg.runtime.shards, **options)  # type: ignore[arg-type]
