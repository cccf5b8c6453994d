"""One shard: a slice of the reservoir, its admission and decoding, and its part of a step.

Shard i of N owns the input partitions p with p mod N = i, a reservoir of the public capacity
M_i (:func:`capacities`: M / N, the first M mod N shards one slot more) and everything that
touches records: decoding, validation, admission (Algorithm R, the window or key slots, decided
by positions and the shard's own generator), dead letters. At a step the driver sends it the
public model state and its part of the sampling plan (:class:`Plan`); it samples its slice, lets
the model sum the clipped contributions and answers with a :class:`ShardContribution`: the
per-block sums (shaped like the model's blocks, whatever the batch) and its public position.
No record, row, index or batch size ever leaves a shard (privacy rule 14 in docs/privacy.md).

A shard keeps its records in a :class:`~stream_vips.core.learner.PrivateLearner` built
non-private and without a trigger: it never steps, draws no noise and has no ledger; it only
admits and decodes exactly as a one-process learner does.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from stream_vips.config import Config
from stream_vips.core import build
from stream_vips.core.data.decoding import decode_batch
from stream_vips.core.data.protocols import KeySlotReservoir, RecordReservoir
from stream_vips.core.data.sampling import FixedSizeSampler, PoissonSampler
from stream_vips.core.keys import reject_keyless
from stream_vips.core.learner import PrivateLearner
from stream_vips.distributed.checkpoint import ShardCheckpoint, ShardCheckpointError, shard_path
from stream_vips.errors import StreamVipsError
from stream_vips.io import DeadLetter, DeadLetterSink, RawRecord, SeekableSource, Source, values_of

#: the spawn key of a shard's sampling generator (apart from its reservoir's, privacy rule 1)
_SAMPLING_STREAM = 14
#: a shard's own trigger never fires: the driver decides when to step
_NEVER = 2**62


class DeadLetterUndelivered(StreamVipsError, RuntimeError):
    """A shard's dead letter was not delivered: nothing was committed past it (the run stops)."""


class SourceFailed(StreamVipsError, RuntimeError):
    """A shard's source raised in ``operation`` (``poll`` or ``commit``): the connector's own
    retries (a Kafka source retries a commit for ``commit_timeout_s``) are behind it, so the run
    stops, as one process stops on the same error; the driver does not poll the shards again.

    It travels from a Ray actor as well as from a local shard: ``error_type`` and ``error_kinds``
    (the qualified names of the error's classes) say what failed without the error itself,
    ``error`` is the error when it survives pickling (else ``None``; a local shard's is also the
    ``__cause__``), ``summary`` is the one line to show."""

    def __init__(self, message: str, index: int | None = None, operation: str = "", error_type: str = "",
                 error_kinds: tuple[str, ...] = (), error: BaseException | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.operation = operation
        self.error_type = error_type
        self.error_kinds = tuple(error_kinds)
        self.error = error
        self.summary = message

    @classmethod
    def of(cls, index: int, operation: str, error: BaseException) -> SourceFailed:
        """Shard ``index``'s source failing in ``operation`` with ``error`` (kept when it pickles)."""
        detail = " ".join(str(error).split()) or "(no message)"
        kinds = tuple(f"{c.__module__}.{c.__qualname__}" for c in type(error).__mro__)
        return cls(f"shard {index}'s source failed in {operation}: {type(error).__name__}: {detail}", index,
                   operation, type(error).__name__, kinds, error if _travels(error) else None)


def _travels(error: BaseException) -> bool:
    """Whether ``error`` comes back whole from pickling (how a Ray actor's error reaches the driver)."""
    try:
        back = pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any failure means it does not travel
        return False
    return type(back) is type(error) and back.args == error.args


def _seeds(seed: int, index: int, stream: int) -> np.random.SeedSequence:
    """Shard ``index``'s generator ``stream`` (0: admission, 1: sampling) of a seeded run."""
    return np.random.SeedSequence(seed, spawn_key=(_SAMPLING_STREAM, index, stream))


def capacities(capacity: int, shards: int) -> list[int]:
    """The public slice sizes M_i: M / N each, the first M mod N shards one more (sum = M)."""
    if shards < 1 or capacity < shards:
        raise ValueError(f"{shards} shards cannot split a reservoir of {capacity}")
    base, extra = divmod(capacity, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


def owner(partition: int, shards: int) -> int:
    """The shard that owns input partition ``partition``: p mod N (fixed, never rebalanced)."""
    return partition % shards


def owned_partitions(index: int, shards: int, partitions: int) -> list[int]:
    """The input partitions shard ``index`` of ``shards`` reads (taken with assign())."""
    return [p for p in range(partitions) if owner(p, shards) == index]


@dataclass(frozen=True)
class Plan:
    """A shard's part of one step's sampling: Poisson at ``rate`` over its slots, or exactly
    ``count`` slots without replacement (the driver's hypergeometric draw)."""

    method: str
    rate: float = 0.0
    count: int = 0


@dataclass(frozen=True)
class ShardStatus:
    """What a shard tells the driver between steps: public counts only (privacy rule 1)."""

    index: int
    seen: int
    size: int
    capacity: int
    full: bool
    valid: int  # slots (record sub-slots under privacy.unit: key) holding a valid record
    rows: int  # slots (record sub-slots) in all
    rejected: Mapping[str, int]
    exhausted: bool = False
    accepted: int = 0  # arrivals that decoded and validated (this shard's life)
    dead_letters: int = 0  # rejected records delivered to the dead-letter sink (this shard's life)
    restored: bool = False  # its slice and positions came back from its checkpoint


@dataclass(frozen=True)
class ShardContribution:
    """A shard's part of one step: per-block clipped sums and its stream position."""

    index: int
    sums: Mapping[str, np.ndarray]
    seen: int


def shard_config(cfg: Config, index: int, shards: int) -> Config:
    """The configuration of shard ``index``'s learner: the reservoir of its slice, the family's
    parameters of the whole run (``dataset_size`` stays M), non-private, never stepping by itself,
    and a seed of its own when the run is seeded (so shards do not admit in lockstep)."""
    params = build.model_params(cfg)  # dataset_size = M where the family takes it
    seed = cfg.privacy.seed
    if seed is not None:
        seed = int(_seeds(seed, index, 0).generate_state(1)[0])
    privacy = dataclasses.replace(cfg.privacy, mode="non_private", noise_multiplier=None, seed=seed,
                                  accounting="stream", ledger=dataclasses.replace(cfg.privacy.ledger, type="memory"))
    size = capacities(cfg.sampling.reservoir, shards)[index]
    sampling = dataclasses.replace(cfg.sampling, reservoir=size, batch_size=1)
    schedule = dataclasses.replace(cfg.schedule, every_records=_NEVER, every_seconds=None)
    runtime = dataclasses.replace(cfg.runtime, engine="local", shards=1)
    model = dataclasses.replace(cfg.model, params=params)
    return dataclasses.replace(cfg, model=model, privacy=privacy, sampling=sampling, schedule=schedule,
                               runtime=runtime)


class Shard:
    """Shard ``index`` of ``shards`` for configuration ``cfg`` (see the module docstring).

    ``source`` and ``dead_letters`` are factories (called here, so a Ray actor opens its own
    connectors on its node): its source of the owned partitions, and where its rejected records go.
    """

    def __init__(self, cfg: Config, index: int, shards: int,
                 source: Callable[[], Source] | None = None,
                 dead_letters: Callable[[], DeadLetterSink] | None = None) -> None:
        if not 0 <= index < shards:
            raise ValueError(f"shard index {index} is not in [0, {shards})")
        self.index = index
        self.shards = shards
        self.learner = PrivateLearner.from_config(shard_config(cfg, index, shards))
        seed = cfg.privacy.seed
        self._rng = np.random.default_rng(np.random.SeedSequence() if seed is None else _seeds(seed, index, 1))
        self._source = source() if source is not None else None
        self._dead = dead_letters() if dead_letters is not None else None
        self._exhausted = False
        self.accepted = 0
        self.dead_letters = 0
        self.max_dead_letter_bytes = cfg.runtime.dead_letter_max_bytes
        path = cfg.runtime.checkpoint_path
        self.checkpoint = (ShardCheckpoint(shard_path(path, index, shards), cfg.runtime.checkpoint_interval_s)
                           if path is not None else None)
        self.restored = False
        if self.checkpoint is not None:
            self._restore(self.checkpoint)

    def _restore(self, checkpoint: ShardCheckpoint) -> None:
        """Load this shard's checkpoint, if any, and seek the source to the positions it reflects."""
        state = checkpoint.load()
        if state is None:
            return
        try:
            self.load_state(state)
        except ValueError as exc:
            raise ShardCheckpointError(f"{checkpoint.path}: {exc}") from exc
        if state["offsets"]:
            if not isinstance(self._source, SeekableSource):
                raise ShardCheckpointError(f"{checkpoint.path} holds source positions, but shard {self.index}'s "
                                           "source cannot seek")
            self._source.seek(state["offsets"])
        self.restored = True

    # -- records in (behind the wall) ----------------------------------------------------------

    def feed(self, values: Sequence[bytes | str | None] | Sequence[Mapping[str, Any]],
             keys: Sequence[object] | None = None) -> ShardStatus:
        """Decode (bytes) or validate (dicts) and admit one batch of this shard's records, as a
        one-process learner does (``keys``: the message keys under ``privacy.unit: key``).
        Returns the shard's public status."""
        batch = self.learner.feed(values, keys=keys)
        self.accepted += int(np.count_nonzero(batch.ok))
        if self.checkpoint is not None and self.checkpoint.due():
            self.checkpoint.save(self.state())
        return self.status()

    def ingest(self, raws: Sequence[RawRecord]) -> ShardStatus:
        """Decode, validate, dead-letter and admit one polled batch (the message key is the
        privacy key under ``privacy.unit: key``; privacy rule 14). Rejects are delivered to the
        dead-letter sink before the batch is offered, so a refused letter stops before the
        records can reach a step."""
        learner = self.learner
        values = values_of(raws)
        keys = learner.arrival_keys(values, [raw.origin.get("key") for raw in raws]) if learner.unit == "key" else None
        if learner.validation == "admitted":
            early = keys.missing() if keys is not None else []
            if early:
                self._dead_letter(raws, early)
            batch = learner.offer_raw(values, keys=keys, on_rejected=lambda found: self._dead_letter(raws, found))
        else:
            batch = decode_batch(learner.model, values)
            if keys is not None:
                batch = reject_keyless(batch, keys)
            if batch.rejected:
                self._dead_letter(raws, batch.rejected)
            batch = learner.offer(batch, keys=keys)
        self.accepted += int(np.count_nonzero(batch.ok))
        return self.status()

    def _dead_letter(self, raws: Sequence[RawRecord], rejected: list[tuple[int, str, str]]) -> None:
        """Deliver the letters and wait for them; a refused letter raises
        :class:`DeadLetterUndelivered` before the batch is offered or the source committed."""
        if self._dead is None:
            return
        cap = self.max_dead_letter_bytes
        try:
            self._dead.send([DeadLetter.bounded(raws[i], reason, detail, cap) for i, reason, detail in rejected])
            self._dead.flush()
        except Exception as exc:
            raise DeadLetterUndelivered(f"shard {self.index}: a dead letter was not delivered ({exc}); stopped "
                                        "without committing the source past it") from exc
        self.dead_letters += len(rejected)

    def poll(self, max_records: int, timeout_s: float) -> ShardStatus:
        """Poll this shard's source once, ingest what it returned and commit it. A source that
        raises (after its own retries) raises :class:`SourceFailed`."""
        if self._source is None:
            raise RuntimeError(f"shard {self.index} has no source")
        try:
            batch = self._source.poll(max_records, timeout_s)
        except Exception as exc:
            raise SourceFailed.of(self.index, "poll", exc) from exc
        if not batch:
            self._exhausted = bool(getattr(self._source, "exhausted", False))
            return self.status()
        self.ingest(batch)
        # the slice first, for exactly these positions, then the commit; a checkpoint that is not
        # due skips its commit too (after a crash more records are read again, none is lost)
        if self.checkpoint is None:
            self._commit(self._source)
        elif self.checkpoint.due():
            self.checkpoint.save(self.state())
            self._commit(self._source)
        return self.status()

    def _commit(self, source: Source) -> None:
        try:
            source.commit()
        except Exception as exc:
            raise SourceFailed.of(self.index, "commit", exc) from exc

    def status(self) -> ShardStatus:
        """Public counts: positions, fill, validity, rejection reasons (privacy rule 1)."""
        res = self.learner.reservoir
        valid = np.asarray(res.valid)
        return ShardStatus(self.index, int(res.seen), int(res.size), int(res.capacity), bool(res.full),
                           int(np.count_nonzero(valid)), int(valid.size),
                           dict(collections.Counter(self.learner.rejected)), self._exhausted,
                           self.accepted, self.dead_letters, self.restored)

    # -- one step's part (the only thing computed from records that leaves) ---------------------

    def contribution(self, model_state: Mapping[str, np.ndarray], plan: Plan) -> ShardContribution:
        """Sample this slice by ``plan`` and return the clipped per-block sums, computed with the
        driver's public model state. Raises ``ReservoirNotFull`` before the slice is full."""
        learner = self.learner
        learner.model.load_state(model_state)
        res = learner.reservoir
        if plan.method == "poisson":
            idx = PoissonSampler(plan.rate).sample(res.size, self._rng, capacity=res.capacity)
        elif plan.method == "fixed":
            if plan.count > 0:
                idx = FixedSizeSampler(plan.count).sample(res.size, self._rng, capacity=res.capacity)
            else:
                idx = FixedSizeSampler(1).sample(res.size, self._rng, capacity=res.capacity)[:0]
        else:
            raise ValueError(f"unknown sampling method {plan.method!r}")
        if learner.unit == "key":
            rows, groups, n_groups = cast(KeySlotReservoir, res).take_groups(idx)
            sums = learner.model.group_clipped_sum(rows, groups, n_groups)
        else:
            sums = learner.model.clipped_sum(cast(RecordReservoir, res).take(idx))
        return ShardContribution(self.index, {k: np.asarray(v, dtype=float) for k, v in sums.items()},
                                 int(res.seen))

    # -- checkpoint -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The shard's checkpoint: its reservoir (rows, positions, admission generator) and the
        source positions it reflects. The sampling generator is recorded but never restored
        (:meth:`load_state`)."""
        positions = self._source.positions() if isinstance(self._source, SeekableSource) else {}
        return {"index": self.index, "shards": self.shards, "reservoir": self.learner.reservoir.get_state(),
                "rng": self._rng.bit_generator.state, "offsets": dict(positions)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state`; refuses a checkpoint of another shard or shard count.

        The reservoir comes back with its admission generator, so the records read again after
        the checkpoint's positions are admitted as they would have been without the restart. The
        sampling generator does not: steps taken after the checkpoint was written used its
        draws, and a later step that drew the same subsample would not be an independent
        subsample, which the accountant's amplification assumes. It is reseeded from the OS."""
        if (state["index"], state["shards"]) != (self.index, self.shards):
            raise ValueError(f"checkpoint of shard {state['index']} of {state['shards']} "
                             f"given to shard {self.index} of {self.shards}")
        self.learner.reservoir.set_state(state["reservoir"])
        self._rng = np.random.default_rng()

    def close(self) -> None:
        """Write a last checkpoint (when one is configured), close the source and dead-letter sink."""
        if self.checkpoint is not None:
            self.checkpoint.save(self.state())
            if isinstance(self._source, SeekableSource):
                self._source.commit_now()
        for part in (self._source, self._dead):
            close = getattr(part, "close", None)
            if close is not None:
                close()
