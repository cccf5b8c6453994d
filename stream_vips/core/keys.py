"""Privacy units of arrivals (privacy rule 12, ``privacy.unit: key``): the key of each arrival
(the configured JSON field, which wins, or the Kafka message key), its 64-bit id, and the
arrivals that have none, rejected as ``missing_key`` while keeping their stream positions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, TypeAlias

import numpy as np

from stream_vips import records
from stream_vips.core.data.decoding import DecodedBatch
from stream_vips.core.data.key_reservoir import MISSING_KEY, key_ids
from stream_vips.errors import ConfigError

#: The privacy keys of a batch's arrivals as given: any values (Kafka message keys, a JSON field's
#: values); one that is no key (``None``, a float, a container) makes its arrival keyless.
RawKeys: TypeAlias = Sequence[object] | np.ndarray


def field_keys(values: Sequence[object], field: str) -> list[object]:
    """The ``field`` of each record (``None`` where it cannot be read): the configured key field
    wins over any other key (privacy rule 12). ``values`` are decoded records (dicts) or raw
    ones (bytes, or ``None`` for a record without a value)."""
    if records.undecoded(values):
        decoded = records.decode_json(values)
        out: list[object] = [None] * len(values)
        for i, obj in zip(decoded.index, decoded.values):
            out[i] = obj.get(field) if isinstance(obj, Mapping) else None
        return out
    return [obj.get(field) if isinstance(obj, Mapping) else None for obj in values]


class ArrivalKeys(NamedTuple):
    """Key ids of one batch's arrivals and the mask of those that have one (privacy rule 12)."""

    ids: np.ndarray
    has: np.ndarray

    def missing(self) -> list[tuple[int, str, str]]:
        """The keyless arrivals as rejections ``(arrival, "missing_key", detail)``."""
        return [(int(i), MISSING_KEY, "no privacy key") for i in np.flatnonzero(~self.has)]


#: The keys of a batch's arrivals, as given or already turned into ids.
Keys: TypeAlias = RawKeys | ArrivalKeys


def reject_keyless(batch: DecodedBatch, keys: Keys | None) -> DecodedBatch:
    """``batch`` with its keyless accepted arrivals rejected as ``missing_key`` (their rows dropped)."""
    return with_keys(batch, keys)[0]


def with_keys(batch: DecodedBatch, keys: Keys | None) -> tuple[DecodedBatch, np.ndarray, np.ndarray]:
    """Key ids of the arrivals, and the batch with keyless arrivals rejected as ``missing_key``."""
    ids, has = arrival_keys(keys, len(batch.ok))
    lost = batch.ok & ~has
    if not lost.any():
        return batch, ids, has
    keep = has[batch.ok]  # rows of accepted arrivals that have a key
    missing = ArrivalKeys(ids, ~lost).missing()
    rejected = sorted(batch.rejected + missing)
    return DecodedBatch(batch.ok & has, {k: v[keep] for k, v in batch.rows.items()}, rejected), ids, has


def arrival_keys(keys: Keys | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Key ids of ``n`` arrivals and the mask of those that have one (privacy rule 12);
    ``keys`` already turned into :class:`ArrivalKeys` are only checked for their length."""
    if isinstance(keys, ArrivalKeys):
        if keys.ids.shape[0] != n:
            raise ValueError(f"{keys.ids.shape[0]} keys for {n} arrivals")
        return keys.ids, keys.has
    if keys is None:
        raise ConfigError("privacy.unit: key needs the key of every arrival (feed(values, keys=...), e.g. the "
                          "Kafka message keys) or privacy.key_field")
    ids, has = key_ids(keys)
    if ids.shape[0] != n:
        raise ValueError(f"{ids.shape[0]} keys for {n} arrivals")
    return ids, has
