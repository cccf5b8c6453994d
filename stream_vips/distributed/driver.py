"""The driver: the privacy wall of a sharded run, in one place (privacy rule 14 in docs/privacy.md).

The shards hold the records; the driver holds everything that spends or releases: the model,
the accountant and the budget monitor, the ledger, the noise generator, the trigger. A step is

1. every shard's slice is full (public sizes; else ``ReservoirNotFull``, nothing spent);
2. the sampling plan (:meth:`ShardedLearner.plan`): Poisson sends every shard the rate q; fixed
   size draws the per-shard counts from the multivariate hypergeometric over the public slice
   sizes M_i, so the union of the shards' draws is a uniform S-subset of the M slots;
3. the public model state and its plan go to every shard, which answers with its clipped
   per-block sums (:class:`~stream_vips.distributed.shard.ShardContribution`); a shard that
   fails or is late abandons the step (:class:`ShardFailure`, nothing spent);
4. the driver adds them up and hands the total to :meth:`PrivateEngine.release`: budget check,
   durable ledger entry, one noise draw, the public normaliser, the M-step.

The engine is the one-process engine, built from the same configuration with the same q, M,
C and z, so the ledger event is the one a single process writes. Its reservoir is
:class:`PublicSlices`: the public sizes and nothing else (it cannot ``take`` a row).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from stream_vips import messages
from stream_vips.config import Config
from stream_vips.core import build
from stream_vips.core.data.window import window_steps
from stream_vips.core.engine import Contribution, PrivateEngine, StepResult
from stream_vips.core.publishing import Publishing
from stream_vips.distributed.pool import ShardFailure, ShardPool
from stream_vips.distributed.shard import Plan, ShardContribution, ShardStatus, capacities
from stream_vips.errors import ConfigError, ReservoirNotFull, StepRefused, StreamVipsError
from stream_vips.io import Sink
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.ledger import Ledger, check_binding
from stream_vips.privacy.mechanisms import make_rng
from stream_vips.records import top_reasons
from stream_vips.schedule import Trigger

log = logging.getLogger("stream_vips.distributed")

#: the phases of a step the driver times: the sampling plan, the shards' sums, the release
PHASES = ("plan", "gather", "release")


class PublishFailed(StreamVipsError, RuntimeError):
    """A paid step's model could not be published before the run was stopped."""


class PublicSlices:
    """The driver's view of the reservoir: the public slice sizes and fill, no rows (the engine
    reads ``capacity``, ``unit`` and ``max_records_per_key``; it never samples here)."""

    def __init__(self, unit: str, sizes: Sequence[int], max_records_per_key: int) -> None:
        self.unit = unit
        self.capacities = list(sizes)
        self.capacity = sum(self.capacities)
        self.max_records_per_key = max_records_per_key
        self.statuses: list[ShardStatus | None] = [None] * len(self.capacities)

    @property
    def seen(self) -> int:
        """Arrivals over all shards (the stream position of a step)."""
        return sum(s.seen for s in self.statuses if s is not None)

    @property
    def size(self) -> int:
        return sum(s.size for s in self.statuses if s is not None)

    @property
    def full(self) -> bool:
        return all(s is not None and s.full for s in self.statuses)

    @property
    def valid_fraction(self) -> float:
        rows = sum(s.rows for s in self.statuses if s is not None)
        return sum(s.valid for s in self.statuses if s is not None) / rows if rows else 0.0


def window_length(cfg: Config, shards: int) -> tuple[int | None, list[int] | None]:
    """Window accounting over shards: L, the largest window length over the shards, and the
    arrivals e_i each shard needs between steps (``None, None``: stream accounting).

    Shard i's window holds its last M_i arrivals; a step needs e_i = ceil(k M_i / M) new
    arrivals at every shard (k = ``schedule.every_records``), so a record is in at most
    ceil(M_i / e_i) steps, and L = max_i of that (ceil(M / k) when N divides M and k)."""
    if cfg.privacy.accounting != "window":
        return None, None
    every = cfg.schedule.every_records
    if every is None:
        raise ConfigError("privacy.accounting: window needs schedule.every_records")
    sizes = capacities(cfg.sampling.reservoir, shards)
    strides = [max(1, math.ceil(every * m / cfg.sampling.reservoir)) for m in sizes]
    return max(window_steps(m, e) for m, e in zip(sizes, strides)), strides


def check(cfg: Config) -> None:
    """Refuse, naming the key, what a sharded run cannot do (the schema refuses the rest)."""
    if cfg.runtime.shards > 1 and cfg.privacy.unit == "key" and cfg.privacy.key_field is not None:
        raise ConfigError("privacy.key_field: must be null with runtime.shards > 1 (the privacy key must be the "
                          "Kafka message key, so one person's records are in one partition and one shard)")


class ShardedLearner(Publishing):
    """The driver of ``pool``'s shards for configuration ``cfg`` (see the module docstring);
    ``ledger`` replaces the configured one (the caller then owns it)."""

    def __init__(self, cfg: Config, pool: ShardPool, ledger: Ledger | None = None) -> None:
        check(cfg)
        n = pool.shards
        if n != cfg.runtime.shards:
            raise ConfigError(f"runtime.shards: {cfg.runtime.shards}, but the pool has {n} shards")
        self.config = cfg
        self.pool = pool
        self.timeout_s = cfg.runtime.shard_timeout_s
        self.model = build.model(cfg, build.model_params(cfg))
        self.model_id = cfg.model.id
        self.unit = cfg.privacy.unit
        self.slices = PublicSlices(self.unit, capacities(cfg.sampling.reservoir, n), cfg.privacy.max_records_per_key)
        self.window_steps, self.strides = window_length(cfg, n)
        self.sampler = build.sampler(cfg)
        self.trigger = Trigger(cfg.schedule.every_records, cfg.schedule.every_seconds)
        rng, seeded = make_rng(cfg.privacy.seed)
        _, engine_rng, self._plan_rng = rng.spawn(3)
        non_private = cfg.privacy.mode == "non_private"
        d = build.diameter(cfg, self.model)
        self.monitor: BudgetMonitor | None = None
        self.ledger: Ledger | None = None
        self._owns_ledger = False
        z, accountant_name = 0.0, "none"
        if not non_private:
            q = self.sampler.rate(self.slices.capacity)
            acct = build.accountant(cfg, self.sampler, q, d)
            accountant_name = acct.name
            z = build.noise_multiplier(cfg, acct, self.sampler, q, d, self.window_steps or cfg.privacy.planned_steps,
                                      self.model)
            self.ledger, self._owns_ledger = (ledger, False) if ledger is not None else (build.ledger(cfg), True)
            try:
                self.monitor = build.monitor(cfg, acct, self.ledger, self.window_steps, self.unit)
            except BaseException:
                self.close()
                raise
            if seeded and self.monitor.steps:  # a restarted seeded run never redraws earlier noise
                engine_rng = np.random.default_rng(np.random.SeedSequence(cfg.privacy.seed,
                                                                          spawn_key=(2, self.monitor.steps)))
        try:
            self.engine = PrivateEngine(self.model, self.slices, self.sampler, self.monitor, z,  # type: ignore[arg-type]
                                        engine_rng, cfg.schedule.tau0, cfg.schedule.kappa, accountant_name,
                                        block_weights=cfg.privacy.block_weights, seeded=seeded,
                                        non_private=non_private, delta=cfg.privacy.delta,
                                        rho_min=cfg.schedule.rho_min, unit=self.unit)
        except ValueError as exc:
            self.close()
            raise ConfigError(f"privacy: {exc}") from exc
        self._shapes = {b.name: tuple(b.shape) for b in self.model.blocks()}
        self.steps_taken = 0
        self.skipped_steps = 0
        self.abandoned_steps = 0
        self._refused: str | None = None
        self._last_seen: list[int] | None = None  # per shard, at the last step (window accounting)
        self._exhausted = False
        # the stream position (arrivals over all shards) of the last step an earlier life paid for:
        # with shards restored from their checkpoints (their positions those of the stream), the
        # trigger counts arrivals past it only, so a restart takes no step an uninterrupted run
        # would not have taken (as one process restored from its checkpoint, rule 7)
        paid = self.ledger is not None and self.monitor is not None and self.monitor.steps > 0
        self._replay_until = self.ledger.last_position if paid and self.ledger is not None else None
        self._stop = threading.Event()
        #: the wall time of each phase of the last released step (public timing, privacy rule 1)
        self.last_phases: dict[str, float] = {}
        #: called with each released step and its phase timings (metrics; set by the caller)
        self.on_step: Callable[[StepResult, Mapping[str, float]], None] | None = None
        self.published = 0
        self.publish_failures = 0  # consecutive failed publishes of a paid step (0: none owed)

    # -- state -------------------------------------------------------------------------------

    @property
    def halted(self) -> bool:
        return self.engine.halted or self._refused is not None

    @property
    def halt_reason(self) -> str | None:
        """Why updates halted (``None`` while they go on)."""
        if self._refused is not None:
            return self._refused
        return self.monitor.halt_reason if self.engine.halted and self.monitor is not None else None

    @property
    def halt_cause(self) -> str | None:
        """``"budget"`` (the planned end), ``"rejected_data"`` (the slices hold mostly rejected
        arrivals) or ``None`` while updates go on: the one-process learner's causes."""
        if self._refused is not None:
            return "rejected_data"
        return "budget" if self.engine.halted else None

    @property
    def exhausted(self) -> bool:
        """Every shard's source said it has nothing more (a finite source read to its end)."""
        return self._exhausted

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """Finish the round in flight, publish the newest model and return from :meth:`serve`
        (thread and signal safe)."""
        self._stop.set()

    @property
    def epsilon_spent(self) -> float:
        return self.engine.epsilon_spent()

    def resume(self, sink: Sink) -> int | None:
        """Take up the newest model ``sink`` holds for this model id, so a restarted driver goes on
        from what it published (public: post-processing of released steps) rather than from the
        prior. Refuses (``LedgerMismatch``) a model this ledger did not pay for, as the one-process
        service does. Returns the version taken up (``None``: nothing published yet).

        A step paid in the ledger but killed before its model was published is not in the sink:
        its version is never published (the next step takes the next ledger step), so no version
        is published twice and the spent budget still counts it."""
        latest = getattr(sink, "latest", None)
        message = latest(self.model_id) if latest is not None else None
        if not message or self.ledger is None or message.get("privacy", {}).get("accountant") == "none":
            return None
        version = int(message["version"])
        check_binding(self.ledger, f"the published model {self.model_id!r} version {version}",
                      message["privacy"].get("ledger_id"), version + 1)
        self.model.load_state(messages.decode_state(message))
        return version

    # -- records in, at the shards ------------------------------------------------------------

    def observe(self, statuses: Sequence[ShardStatus]) -> None:
        """Take the shards' public statuses: fill, and arrivals for the trigger."""
        before = self.slices.seen
        for status in shard_statuses(statuses):
            self.slices.statuses[status.index] = status
        if self._replay_until is not None and not any(s.restored for s in statuses):
            self._replay_until = None  # shards that start empty count positions from 0 again
        if self._replay_until is not None:  # arrivals an earlier life's steps already covered
            before = max(before, self._replay_until)
        self.trigger.observe(max(0, self.slices.seen - before))
        self._exhausted = all(s.exhausted for s in statuses)

    def feed(self, batches: Sequence[Sequence[Any]], keys: Sequence[Sequence[object] | None] | None = None
             ) -> StepResult | None:
        """Give shard i the records ``batches[i]`` (its partitions' records; ``keys[i]`` their
        message keys under ``privacy.unit: key``), then step if the trigger is due."""
        keys = keys if keys is not None else [None] * self.pool.shards
        self.observe(self.pool.call("feed", [(b, k) for b, k in zip(batches, keys, strict=True)], self.timeout_s))
        return self.maybe_step()

    def poll(self, max_records: int | None = None, timeout_s: float | None = None) -> StepResult | None:
        """One round: every shard polls its own source once; then step if due."""
        rt = self.config.runtime
        args = (max_records or rt.poll_max_records, rt.poll_timeout_s if timeout_s is None else timeout_s)
        self.observe(self.pool.call("poll", [args] * self.pool.shards, self.timeout_s + args[1]))
        return self.maybe_step()

    def refresh(self, wait_s: float = 60.0) -> None:
        """Ask every shard for its status, waiting up to ``wait_s`` for shards being restarted
        (a restarted shard comes back empty: no step until its slice is full again)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.observe(self.pool.call("status", [()] * self.pool.shards, self.timeout_s))
                return
            except ShardFailure as exc:
                if exc.cause != "lost" or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def run(self, max_rounds: int | None = None) -> int:
        """Poll rounds until every shard's source is exhausted, updates halt or ``max_rounds``;
        a lost shard is waited for (Ray restarts it). A shard's source that fails past its own
        retries raises :class:`~stream_vips.distributed.shard.SourceFailed` out of here, before the
        round's step (nothing spent), as one process stops on its source's error; it is not
        polled again. Returns the steps taken."""
        rounds = 0
        while not self.halted and not self._exhausted and (max_rounds is None or rounds < max_rounds):
            try:
                self.poll()
            except ShardFailure as exc:
                log.warning("a poll round failed (%s); waiting for the shards", exc)
                self.refresh()
            rounds += 1
        return self.steps_taken

    def serve(self, sink: Sink, max_rounds: int | None = None,
              on_round: Callable[[ShardedLearner], None] | None = None) -> int:
        """:meth:`run` publishing to ``sink``: the newest model at most every
        ``runtime.publish_interval_s`` and once more at the end (marked halted when updates
        halted), until the sources are exhausted, updates halt, :meth:`stop` is called or
        ``max_rounds`` rounds. ``on_round`` is called after every round (progress, metrics).

        A model that fails to publish is owed: no shard is polled and no step starts until it
        goes out (retried after 1 s, doubling to 60 s), because a driver that died on it would be
        restarted, pay another step and fail again. Stopped while a model is owed, one last
        attempt raises :class:`PublishFailed` when it fails too. Returns the steps taken."""
        if self.monitor is not None and not self.halted:
            self.monitor.check_room(self.engine.event())  # a spent ledger halts now, not at the first step
        interval = self.config.runtime.publish_interval_s
        # the versions the ledger already holds were an earlier life's to publish: this driver
        # publishes only the steps it takes (never a version twice; last_step is None until then)
        last_publish, published = float("-inf"), self.last_step
        retry_at = 0.0
        rounds = 0
        while (not self._stop.is_set() and not self.halted and not self._exhausted
               and (max_rounds is None or rounds < max_rounds)):
            rounds += 1
            if self.publish_failures:  # paused until the owed model goes out
                self._stop.wait(max(0.0, retry_at - time.monotonic()))
                if self._stop.is_set():
                    break
            else:
                self.run(max_rounds=1)
            due = time.monotonic() - last_publish >= interval or self.publish_failures
            if self.last_step != published and due:
                if self._publish(sink, self.message()):
                    published, last_publish = self.last_step, time.monotonic()
                else:
                    retry_at = time.monotonic() + min(2.0 ** (self.publish_failures - 1), 60.0)
            if on_round is not None:
                on_round(self)
        message = self.message(halted=self.halted)
        if message is not None and (self.last_step != published or (self.halted and self.steps_taken)):
            if not self._publish(sink, message):
                raise PublishFailed(f"publishing model version {message['version']} failed; stopped (the ledger "
                                    "still holds every released step)")
        sink.flush()
        return self.steps_taken

    def _publish(self, sink: Sink, message: dict[str, Any] | None) -> bool:
        """Publish ``message``; whether it went out (a failure is logged and counted)."""
        if message is None:
            return True
        try:
            sink.publish(self.model_id, message)
        except Exception as exc:  # noqa: BLE001 - any sink failure leaves the model owed
            self.publish_failures += 1
            log.error("publishing model version %s failed (%d in a row): %s; no step until it is published",
                      message.get("version"), self.publish_failures, exc)
            return False
        if self.publish_failures:
            log.warning("model version %s published after %d failed attempts; resuming",
                        message.get("version"), self.publish_failures)
        self.publish_failures = 0
        self.published += 1
        return True

    def maybe_step(self) -> StepResult | None:
        """A step when the trigger is due and every slice is full (a late shard: skipped)."""
        if self.halted or not self.slices.full or not self.trigger.due():
            return None
        if self._replay_until is not None and self.slices.seen <= self._replay_until:
            return None  # an earlier life paid for a step at this position
        if self.strides is not None and not self._window_ready():
            return None
        try:
            return self.step()
        except (ShardFailure, ReservoirNotFull) as exc:  # a shard lost, late, or restarted empty
            log.warning("step abandoned before anything was spent: %s", exc)
            self.abandoned_steps += 1
            return None

    # -- the step: the privacy wall ------------------------------------------------------------

    def plan(self) -> list[Plan]:
        """Each shard's part of the next batch: the rate q (Poisson), or counts from the
        multivariate hypergeometric over the public slice sizes summing to S (fixed size)."""
        sizes = self.slices.capacities
        if self.sampler.name == "poisson":
            q = self.sampler.rate(self.slices.capacity)
            return [Plan("poisson", rate=q) for _ in sizes]
        counts = self._plan_rng.multivariate_hypergeometric(np.asarray(sizes, dtype=np.int64),
                                                            int(self.sampler.normaliser(self.slices.capacity)))
        return [Plan("fixed", count=int(c)) for c in counts]

    def _window_ready(self) -> bool:
        if self._last_seen is None or self.strides is None:
            return True
        now = [s.seen if s is not None else 0 for s in self.slices.statuses]
        return all(n - last >= e for n, last, e in zip(now, self._last_seen, self.strides))

    def step(self) -> StepResult | None:
        """One private step now (see the module docstring); ``None`` when the budget refused
        it (then :attr:`halted`). Raises ``ReservoirNotFull`` before every slice is full,
        ``StepRefused`` under window accounting when a shard has not had its e_i arrivals, and
        :class:`ShardFailure` when a shard fails or is late (nothing spent in each case)."""
        if self.halted:
            return None
        started = time.perf_counter()
        if not self.slices.full:
            raise ReservoirNotFull(f"the shards' slices hold {self.slices.size} of {self.slices.capacity} records; "
                                   "no release until every slice is full")
        if self.strides is not None and not self._window_ready():
            raise StepRefused("window accounting: every shard needs its share of schedule.every_records arrivals "
                              f"({self.strides}) since the last step, or a record would be in more than "
                              f"{self.window_steps} steps")
        if not self.engine.non_private:
            empty = 1.0 - self.slices.valid_fraction
            if empty > self.config.sampling.max_rejected_fraction:
                rejected: dict[str, int] = {}
                for s in self.slices.statuses:
                    for reason, count in (s.rejected if s is not None else {}).items():
                        rejected[reason] = rejected.get(reason, 0) + count
                self._refused = (f"{empty:.0%} of the reservoir's slots hold rejected arrivals (more than "
                                 f"sampling.max_rejected_fraction = {self.config.sampling.max_rejected_fraction:g}); "
                                 f"top rejection reasons: {top_reasons(rejected) or 'none recorded'}")
                log.error("updates halted before spending: %s", self._refused)
                return None
        planned = time.perf_counter()
        plans = self.plan()
        gathering = time.perf_counter()
        total = self.gather(plans)
        releasing = time.perf_counter()
        result = self.engine.release(total, started)
        self.trigger.reset()
        if result is not None:
            self.steps_taken += 1
            self._last_seen = [s.seen if s is not None else 0 for s in self.slices.statuses]
            self.last_phases = {"plan": gathering - planned, "gather": releasing - gathering,
                                "release": time.perf_counter() - releasing}
            if self.on_step is not None:
                self.on_step(result, self.last_phases)
        return result

    def gather(self, plans: Sequence[Plan]) -> Contribution:
        """Every shard's contribution under the public model state, checked and added up. Only
        per-block sums of the declared shapes are accepted (a shard cannot hand over rows)."""
        state = self.pool.share(self.model.state())
        answers = self.pool.call("contribution", [(state, p) for p in plans], self.timeout_s)
        sums = {name: np.zeros(shape) for name, shape in self._shapes.items()}
        position = 0
        for i, answer in enumerate(answers):
            if not isinstance(answer, ShardContribution) or answer.index != i:
                raise ShardFailure(f"shard {i} answered {type(answer).__name__}, not its contribution", i)
            if {k: tuple(np.shape(v)) for k, v in answer.sums.items()} != self._shapes:
                raise ShardFailure(f"shard {i}'s contribution is not one sum per block {self._shapes}", i)
            for name in sums:
                sums[name] = sums[name] + np.asarray(answer.sums[name], dtype=float)
            position += answer.seen
        return Contribution(sums, position)

    def close(self) -> None:
        """Close the ledger this driver opened (the pool is the caller's)."""
        if self.monitor is not None:
            self.monitor.settle()
        if self._owns_ledger and self.ledger is not None:
            self.ledger.close()
            self._owns_ledger = False

    def __enter__(self) -> ShardedLearner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shard_statuses(answers: Sequence[Any]) -> list[ShardStatus]:
    """``answers`` checked to be shard statuses (public counts)."""
    out = []
    for answer in answers:
        if not isinstance(answer, ShardStatus):
            raise StreamVipsError(f"a shard answered {type(answer).__name__}, not its status")
        out.append(answer)
    return out

