"""Release functions: many independent releases of one neighbouring side, through the real engine.

A *release function* is any callable ``release(n) -> (n, k) array`` returning ``n`` independent
releases of one side of a neighbouring pair, each flattened to k numbers. The statistics in
:mod:`stream_vips.audit.stats` only see such arrays, so any path that produces releases (the
engine on a hand-built reservoir here; a whole pipeline fed from Kafka later) can be audited
by the same test.

:class:`EngineTrials` builds that function for the engine: a reservoir of ``capacity`` slots
holding one chosen record in slot 0 and null records elsewhere (rejected arrivals, which leave
their slots empty and contribute zero; reservoir membership depends on positions only, so the
neighbouring stream differs in exactly that slot), the configured sampler, a budget monitor with
a ledger, and a :class:`~stream_vips.core.engine.PrivateEngine`. Each release is one
``PrivateEngine.step()``: sampling, the model's clipping, the monitor's admission, the engine's
noise and normalisation. The model's ``update`` is replaced on the instance by a hook that
records the noisy mean it receives (the privatized statistic) instead of learning from it, so
every step releases from the same model state: the trials audit one release, repeated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from stream_vips.core.data.key_reservoir import KeyReservoir
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import make_sampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.base import Block, Model
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import MemoryLedger

#: The monitor must admit every trial; it gates releases but never shapes them.
AUDIT_BUDGET = 1e300


class ReleaseFunction(Protocol):
    """``n`` independent releases of one side, as an (n, k) float array."""

    def __call__(self, n: int) -> np.ndarray: ...


def flatten(noisy_mean: Mapping[str, np.ndarray], blocks: tuple[Block, ...]) -> np.ndarray:
    """One release as a vector: every block in order; symmetric blocks by their upper triangle
    (the mirrored half repeats the same noise draw and carries nothing new)."""
    parts = []
    for block in blocks:
        arr = np.asarray(noisy_mean[block.name], dtype=float)
        parts.append(arr[np.triu_indices(block.shape[0])] if block.symmetric else arr.ravel())
    return np.concatenate(parts)


def parse_records(model: Model, records: Sequence[Any]) -> dict[str, np.ndarray]:
    """The records' reservoir rows through the model's own parsing; every one must be accepted."""
    if not records:
        return {name: np.zeros((0, *shape), dtype=dt) for name, (dt, shape) in model.row_layout().items()}
    parsed = model.parse_batch(list(records))
    if len(parsed.accepted) != len(records):
        raise ValueError(f"audit records {records!r} were rejected by {type(model).__name__}: {parsed.rejected}")
    return parsed.rows


def parse_record(model: Model, record: Any | None) -> dict[str, np.ndarray] | None:
    """The record's reservoir row through the model's own parsing (None: a null record)."""
    return None if record is None else parse_records(model, [record])


class EngineTrials:
    """Releases of one side: ``record`` in slot 0 of a reservoir of null records, via the engine.

    ``make_model(capacity)`` builds a fresh model (its ``dataset_size`` is the capacity);
    ``sampling`` and ``batch_size`` configure the sampler exactly as the pipeline does
    (``make_sampler``); ``seed`` seeds both the reservoir and the engine's generator;
    ``block_weights`` is the engine's noise allocation (None: the family's default).

    With ``unit="key"`` (privacy rule 12) the reservoir is a :class:`KeyReservoir` of
    ``capacity`` key slots holding at most ``records_per_key`` records each, and ``record`` is
    the audited key's sequence of records: they arrive first under key 0 and fill key slot 0;
    keys 1 .. capacity - 1 arrive once each with a rejected (null) record, so their slots
    contribute zero. The neighbouring side replaces all of key 0's records, as key-level
    adjacency does; the engine clips per key (``group_clipped_sum``).
    """

    def __init__(
        self,
        make_model: Callable[[int], Model],
        record: Any | None,
        *,
        capacity: int,
        sampling: str,
        batch_size: int,
        noise_multiplier: float,
        seed: int,
        delta: float = 1e-5,
        unit: str = "record",
        records_per_key: int = 1,
        block_weights: Mapping[str, float] | None = None,
    ) -> None:
        self.model = make_model(capacity)
        self.blocks = tuple(self.model.blocks())
        seeds = np.random.SeedSequence(seed).spawn(2)
        records = [] if record is None else (list(record) if unit == "key" else [record])
        rows = parse_records(self.model, records)
        n_null = capacity - (1 if records else 0)
        accepted = np.concatenate([np.ones(len(records), dtype=bool), np.zeros(n_null, dtype=bool)])
        if unit == "key":
            self.reservoir = KeyReservoir(self.model.row_layout(), capacity, records_per_key,
                                          np.random.default_rng(seeds[0]))
            keys = np.concatenate([np.zeros(len(records), dtype=np.int64), np.arange(1, n_null + 1)])
            self.reservoir.add_batch(rows, keys, accepted=accepted)
        else:
            self.reservoir = Reservoir(self.model.row_layout(), capacity, np.random.default_rng(seeds[0]))
            self.reservoir.add_batch(rows, accepted=accepted)
        self.sampler = make_sampler(sampling, batch_size, capacity)
        # The strong-composition accountant answers a huge budget in a few cheap evaluations
        # (PLD would compose the event up to the monitor's search window); it only gates.
        self.monitor = BudgetMonitor(AUDIT_BUDGET, delta, make_accountant("strong", self.sampler.name), MemoryLedger())
        self.engine = PrivateEngine(
            self.model, self.reservoir, self.sampler, self.monitor, noise_multiplier,
            np.random.default_rng(seeds[1]), tau0=1.0, kappa=1.0, accountant_name="strong", seeded=True,
            unit=unit, block_weights=block_weights,
        )
        self._captured: list[np.ndarray] = []

        def record_release(noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
            self._captured.append(flatten(noisy_mean, self.blocks))

        self.model.update = record_release  # type: ignore[method-assign]

    @property
    def event(self) -> SubsampledGaussianEvent:
        """The privacy event the engine ledgers for each release (what the claim is about)."""
        return self.engine.event()

    def __call__(self, n: int) -> np.ndarray:
        """``n`` further releases, one ``PrivateEngine.step()`` each."""
        self._captured.clear()
        for _ in range(int(n)):
            if self.engine.step() is None:
                raise RuntimeError(f"the audit's budget monitor refused a step: {self.monitor.halt_reason}")
        out = np.array(self._captured)
        self._captured.clear()
        return out


def claimed_epsilon(event: SubsampledGaussianEvent, delta: float, accountant: str = "auto") -> float:
    """epsilon at ``delta`` the project's accountant states for one release of ``event``."""
    return float(make_accountant(accountant, event.sampling).epsilon([event], delta))
