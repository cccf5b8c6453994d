"""The run loop: source -> records -> reservoir -> trigger -> private engine -> model sink.

:class:`Application` (Quix Streams style: one app object, ``run()``, SIGTERM) polls the source in
batches, decodes and validates the whole batch at once, sends rejects to the dead-letter sink
with their reason codes, offers the accepted rows to the reservoir and runs a private step each
time the trigger fires (every ``every_records`` arrivals, valid or not, counted exactly across poll
boundaries, and/or every ``every_seconds``). Each released step is published as a versioned
model message (version = ledger step) before the source is committed; with
``publish_interval_s > 0`` only the newest step is published, at most that often (and always
before halting or shutting down), because each message's epsilon costs one accountant
evaluation, which for PLD is slower than a step.

With ``decode_workers: 1`` a worker process decodes and validates each polled batch while the
loop polls the next one (:mod:`stream_vips.core.data.decoding`), so one batch is in flight: polled, not yet
applied. The loop then commits a source at the positions after the batches it has applied (a
source with ``positions()``, e.g. Kafka), or, for other sources, only when nothing is in flight;
a rebalance finishes the batch in flight before partitions are given up (``before_revoke``),
and a shutdown applies it before closing.

Budget exhaustion halts updates for good: the last model is re-published with
``privacy.halted: true``, the source is paused, and (``on_halt: stay``) metrics and health keep
being served until a signal arrives, or (``on_halt: exit``) ``run()`` returns. SIGTERM/SIGINT
finish the step in flight, flush the sinks and close everything.

Length: over 600 lines, one module: it is one loop over one set of state (the batches in
flight, the positions applied, a dead letter unconfirmed, a model owed), and its guarantees are the
order of its steps: dead letters confirmed and each paid step's model published before the source is
committed past them, the batch in flight applied before a rebalance or a shutdown. Dead letters,
commits, publishing and halting in separate modules would each hold part of that state and spread
one ordering over several files. The process settings a run holds (garbage collection, BLAS
threads) are :mod:`stream_vips.service.tuning`.
"""

from __future__ import annotations

import collections
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stream_vips.config import Config, ConfigError
from stream_vips.core.data.decoding import DecodedBatch, Decoder, InlineDecoder, decode_batch, make_decoder
from stream_vips.core.engine import StepResult
from stream_vips.core.keys import reject_keyless
from stream_vips.core.learner import PrivateLearner
from stream_vips.errors import StreamVipsError
from stream_vips.io import (
    DeadLetter,
    DeadLetterSink,
    FiniteSource,
    LagReporting,
    PartitionedSource,
    RawRecord,
    RebalancingSource,
    RecordBatch,
    SeekableSource,
    Sink,
    Source,
    values_of,
)
from stream_vips.privacy.ledger import check_binding
from stream_vips.service import build
from stream_vips.service.checkpoint import CheckpointError, CheckpointHook, attach
from stream_vips.service.metrics import Metrics, MetricsServer, bind_error, port_free
from stream_vips.service.tuning import blas_limit, gc_tuned

log = logging.getLogger("stream_vips.service.app")


class PublishError(StreamVipsError, RuntimeError):
    """The model sink failed to deliver a message; the run stops rather than drop it."""


class DeadLetterError(StreamVipsError, RuntimeError):
    """A dead letter was not delivered: the run stops without committing the source past it."""


@dataclass
class RunStats:
    """Counters of one run (also exported as metrics)."""

    records: int = 0
    accepted: int = 0
    rejected: collections.Counter = field(default_factory=collections.Counter)
    updates: int = 0
    skipped_steps: int = 0  # trigger points an earlier life already paid for (after a restore)
    duplicates: int = 0  # records dropped because this process had already applied their offsets
    not_decoded: int = 0  # arrivals the reservoir did not admit, never decoded (sampling.validation: admitted)
    published: int = 0
    halted: bool = False
    halt_reason: str | None = None
    halt_cause: str | None = None  # "budget" (the planned end) or "rejected_data" (the input is wrong)
    stopped_by_signal: bool = False
    last_message: dict[str, Any] | None = None


class Application:
    """The runtime around one :class:`~stream_vips.core.learner.PrivateLearner` (see :meth:`from_config`).

    It polls the source, keeps one batch in flight, dead-letters rejects, commits, answers
    rebalances, checkpoints (through the source wrapper of :mod:`stream_vips.service.checkpoint`),
    publishes messages the learner builds, serves metrics and handles signals; the learner does
    everything private, and no I/O. ``progress`` is called with the application once per loop
    iteration (the demo's progress bar); ``metrics_address`` ``(host, port)`` starts the HTTP
    server for the duration of :meth:`run` (port 0 binds a free port, see :attr:`metrics_port`).
    """

    def __init__(
        self,
        *,
        learner: PrivateLearner,
        source: Source,
        sink: Sink,
        dead_letter: DeadLetterSink,
        metrics: Metrics | None = None,
        metrics_address: tuple[str, int] | None = None,
        poll_max_records: int = 5000,
        poll_timeout_s: float = 0.2,
        on_halt: str = "stay",
        blas_threads: int | None = 1,
        progress: Callable[[Application], None] | None = None,
        publish_interval_s: float = 0.0,
        decode_workers: int = 0,
        model_params: dict[str, Any] | None = None,
        dead_letter_max_bytes: int = 65536,
        source_check_s: float = 30.0,
    ) -> None:
        if on_halt not in ("stay", "exit"):
            raise ValueError(f"on_halt must be 'stay' or 'exit', got {on_halt!r}")
        if decode_workers not in (0, 1):
            raise ValueError(f"decode_workers must be 0 or 1, got {decode_workers!r}")
        if decode_workers and model_params is None:
            raise ValueError("decode_workers needs model_params: the worker builds its own model from them")
        self.learner = learner
        self.source = source
        self.sink = sink
        self.dead_letter = dead_letter
        engine = learner.engine
        self.metrics = metrics or Metrics(learner.model.family, engine.sampler.name, engine.accountant_name)
        self.metrics_address = metrics_address
        self.poll_max_records = int(poll_max_records)
        self.poll_timeout_s = float(poll_timeout_s)
        self.on_halt = on_halt
        self.blas_threads = blas_threads
        self.progress = progress
        self.publish_interval_s = float(publish_interval_s)
        self.decode_workers = decode_workers
        self.model_params = model_params
        self.dead_letter_max_bytes = int(dead_letter_max_bytes)
        self.source_check_s = float(source_check_s)
        self._source_check_at: float | None = None  # monotonic time of the next coverage check
        self._floors: dict[tuple[str, int], int] = {}  # per partition: offset after the last one taken
        self._checkpoint: CheckpointHook | None = None
        self._dead_letter_failure: Exception | None = None
        self._decoder: Decoder = InlineDecoder(learner.model)
        # (raws, positions after, values)
        self._inflight: collections.deque[tuple[Any, dict | None, list[bytes]]] = collections.deque()
        self._applied: dict | None = None  # source positions after the last applied batch
        self._last_publish = float("-inf")
        self._unpublished = False
        self._publish_failures = 0  # consecutive failed publishes of a paid step (0: none owed)
        self._publish_retry_at = 0.0
        self.stats = RunStats()
        self._stop = threading.Event()
        self._server: MetricsServer | None = None
        self._metrics_port: int | None = None
        m = self.metrics
        m.reservoir_capacity.set(learner.reservoir.capacity)
        if not engine.non_private:
            m.epsilon_budget.set(engine.monitor.epsilon_budget)
            m.delta.set(engine.monitor.delta)
        m.epsilon_spent.set(engine.epsilon_spent())

    # the learner's parts, for callers that look inside (tests, benchmarks, the demo)
    model = property(lambda self: self.learner.model)
    engine = property(lambda self: self.learner.engine)
    reservoir = property(lambda self: self.learner.reservoir)
    trigger = property(lambda self: self.learner.trigger)
    ledger = property(lambda self: self.learner.ledger)
    model_id = property(lambda self: self.learner.model_id)

    @classmethod
    def from_config(cls, config: Config, **parts: Any) -> Application:
        """Build the learner and every connector from a validated :class:`~stream_vips.config.Config`.

        ``parts`` replace configured ones by name (``source``, ``sink``, ``dead_letter``,
        ``ledger``, ``progress``, ``metrics_address``): tests and the demo pass in-memory
        connectors this way. A problem building a part raises ``ConfigError`` naming its section;
        state that the ledger did not pay for raises ``LedgerMismatch``.
        """
        cfg = build.check(config)  # every key, before anything is created
        if "metrics_address" not in parts and cfg.metrics.enabled:
            port_free(cfg.metrics.host, cfg.metrics.port)  # before anything is created: nothing left behind
        given = parts.pop("ledger", None)
        opened = None if given is not None or cfg.privacy.mode == "non_private" else build.ledger(cfg)
        try:
            learner = PrivateLearner.from_config(cfg, ledger=given or opened)
        except BaseException:
            if opened is not None:
                opened.close()
            raise
        built: list[Any] = [opened] if opened is not None else []  # made here, closed here if the start fails
        try:
            if learner.window_steps and cfg.runtime.checkpoint_path is None:  # before any connector exists
                raise ConfigError(
                    "privacy.accounting: window accounting in a service needs runtime.checkpoint_path: a restart "
                    "re-reads the records after the last commit, and only a restored checkpoint puts them back at "
                    "the stream positions that bound each record's steps")
            connectors = {}
            for kind in ("source", "sink", "dead_letter"):
                if kind in parts:
                    connectors[kind] = parts.pop(kind)
                    continue
                connectors[kind] = build.connector(kind, cfg)
                built.append(connectors[kind])
            metrics_address = parts.pop(
                "metrics_address", (cfg.metrics.host, cfg.metrics.port) if cfg.metrics.enabled else None
            )
            app = cls(
                learner=learner, metrics_address=metrics_address,
                poll_max_records=cfg.runtime.poll_max_records, poll_timeout_s=cfg.runtime.poll_timeout_s,
                on_halt=cfg.runtime.on_halt, blas_threads=cfg.runtime.blas_threads,
                publish_interval_s=cfg.runtime.publish_interval_s, decode_workers=cfg.runtime.decode_workers,
                model_params=cfg.model.params, dead_letter_max_bytes=cfg.runtime.dead_letter_max_bytes,
                source_check_s=cfg.runtime.source_check_s,
                **connectors, **parts,
            )
            if cfg.runtime.checkpoint_path is not None:
                try:
                    attach(app, cfg.runtime.checkpoint_path, cfg.runtime.checkpoint_interval_s)
                except CheckpointError as exc:
                    raise ConfigError(f"runtime.checkpoint_path: {exc}") from exc
                app.metrics.reservoir_records.set(app.reservoir.size)
            learner.check_window_position()  # after the checkpoint's restore, before anything is read
            if cfg.privacy.ledger.paying_ahead():
                learner.pay_ahead(app.source.total() if isinstance(app.source, FiniteSource) else None)
            app.check_published()
            return app
        except BaseException:
            for connector in reversed(built):  # a Kafka source left open stays a group member until its timeout
                try:
                    connector.close()
                except Exception as exc:
                    log.warning("closing %s after a failed start: %s", type(connector).__name__, exc)
            learner.close()  # release the ledger's lock when start-up fails
            raise

    # ------------------------------------------------------------------------------------------

    @property
    def metrics_port(self) -> int | None:
        """The port the metrics server is (or was last) bound to; ``None`` before serving."""
        return self._metrics_port

    @property
    def halted(self) -> bool:
        return self.learner.halted

    def stop(self) -> None:
        """Ask the run loop to finish the step in flight and shut down (thread/signal safe)."""
        self._stop.set()

    def run(self, on_start: Callable[[Application], None] | None = None) -> RunStats:
        """Consume until the source is exhausted, a signal arrives, or (``on_halt: exit``) the
        budget is spent. Always flushes and closes the source, sinks and ledger. ``on_start`` is
        called once the metrics server is bound (its real port known), before consuming."""
        restore = self._install_signal_handlers()
        try:
            if self.metrics_address is not None:
                try:
                    self._server = MetricsServer(self.metrics, *self.metrics_address)
                except OSError as exc:
                    raise bind_error(*self.metrics_address, exc) from exc
                self._metrics_port = self._server.port
            if not self.engine.non_private and not self.halted:
                # the accountant's search, before consuming; a ledger with no room left halts now
                self.engine.monitor.check_room(self.engine.event())
            self._after_steps()
            if on_start is not None:
                on_start(self)
            self._decoder = make_decoder(self.decode_workers, self.model, self.model.family, self.model_params or {},
                                         self.learner.validation)
            if isinstance(self.source, RebalancingSource):
                self.source.before_revoke = self._before_revoke
            with blas_limit(self.blas_threads), gc_tuned(self.poll_max_records):
                self.metrics.set_ready(True)
                self._loop()
        finally:
            self._shutdown()
            restore()
        return self.stats

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.metrics.tick()
            self._check_source()
            if self.halted:
                if self.on_halt == "exit":
                    break
                self._stop.wait(max(self.poll_timeout_s, 0.1))
                continue
            raws = self._take_new(self.source.poll(self.poll_max_records, self.poll_timeout_s))
            if not raws and self._publish_failures:  # paused until the owed model goes out
                self._stop.wait(min(max(self._publish_retry_at - time.monotonic(), 0.0), 0.5))
            if raws:
                values = values_of(raws)
                self._decoder.submit(values)
                self._inflight.append((raws, self._positions(), values))
                while len(self._inflight) > self._decoder.overlaps:
                    self._apply_next()
                self._commit()
                self._export_lag()
            else:
                self._settle()
                if self._time_due() and not self._publish_failures:
                    self._step()
            if self._unpublished and time.monotonic() >= max(self._last_publish + self.publish_interval_s,
                                                             self._publish_retry_at):
                self._publish_latest(retry=True)
            if self.progress is not None:
                self.progress(self)
            if not raws and self.source.exhausted:
                break
        self._settle()  # a signal: the batch in flight is applied (no step) before closing
        if self._unpublished:  # exhausted or signalled: the newest model goes out before closing
            self._publish_latest()
        self._commit(final=True)  # the last checkpoint and commit, whatever their intervals

    def _positions(self) -> dict | None:
        """The source's positions after everything it returned so far (None: it has none).

        Window accounting refuses a source of several partitions here, before the batch is
        applied: their records interleave differently when a restart re-reads them, so a record
        could come back at a later position and be in more steps than the window counts."""
        positions = self.source.positions() if isinstance(self.source, SeekableSource) else None
        if self.learner.window_steps and positions is not None and len(positions) > 1:
            raise ConfigError(
                f"privacy.accounting: window accounting needs a source of one partition, this one reads "
                f"{len(positions)}: a restart re-reads records in another order, at positions the window does "
                "not bound (use one partition per service, or stream accounting)")
        return positions

    def _apply_next(self) -> None:
        """Apply the oldest batch in flight (once halted it is dropped: updates have ended)."""
        raws, positions, values = self._inflight.popleft()
        batch = self._decoder.result()
        if not self.halted:
            self._apply(raws, batch, values)
            self._applied = positions

    def checkpoint_with(self, hook: CheckpointHook) -> None:
        """Checkpoint the learner before every commit of the (seekable) source (:mod:`.checkpoint`)."""
        self._checkpoint = hook

    def _commit(self, final: bool = False) -> None:
        """Commit the source up to the applied batches (without positions: when none is in
        flight), after every dead letter of those batches is confirmed; ``final`` commits (and
        checkpoints) now, whatever the source's interval. With a checkpoint, the learner's state
        for the positions is written first, at most every checkpoint interval (a skipped
        checkpoint skips its commit)."""
        self._confirm_dead_letters()
        if self._applied is None and self._inflight:
            return
        if self._checkpoint is not None:
            if final or self._checkpoint.due():
                positions = self._applied if self._applied is not None else self.source.positions()
                self._checkpoint.save(self.learner, positions)
                self.source.commit_now(positions)
            return
        commit = self.source.commit_now if final and isinstance(self.source, SeekableSource) else self.source.commit
        if self._applied is not None:
            commit(self._applied)
        else:
            commit()

    def _confirm_dead_letters(self) -> None:
        """Wait until the dead-letter sink has every letter; a failure stops the run with nothing
        committed past it (a restart re-reads those records and pays no budget twice)."""
        if self._dead_letter_failure is None:
            try:
                self.dead_letter.flush()
            except Exception as exc:
                self._dead_letter_failure = exc
        if self._dead_letter_failure is not None:
            exc = self._dead_letter_failure
            raise DeadLetterError(f"a dead letter was not delivered ({exc}); stopped without committing "
                                  "the source past it") from exc

    def _take_new(self, raws: Sequence[RawRecord]) -> Sequence[RawRecord]:
        """The polled records minus any whose offset this process has already taken: a record
        must never occupy two reservoir positions (the source guarantees it too; this holds
        whatever the source does)."""
        if not isinstance(raws, RecordBatch) or not raws:
            return raws
        kept, dropped = raws.keep_from(self._floors)
        if dropped:
            self.stats.duplicates += dropped
            self.metrics.records_duplicate.inc(dropped)
            log.error("dropped %d records whose offsets were already taken by this process", dropped)
        self._floors.update(kept.ends())
        return kept

    def restored(self, offsets: dict[tuple[str, int], int]) -> None:
        """The learner was restored from a checkpoint taken at source ``offsets``: records before
        them are in its reservoir already, so they are never taken again."""
        self._floors.update(offsets)

    def check_published(self) -> None:
        """Refuse to start when the latest published model was not paid for by this ledger (a
        deleted, replaced or rolled-back ledger); raises ``LedgerMismatch``."""
        if self.engine.non_private:
            return
        message = self.sink.latest(self.model_id)
        if not message or message.get("privacy", {}).get("accountant") == "none":
            return
        check_binding(self.learner.ledger, f"the published model {self.model_id!r} version "
                      f"{message.get('version')}", message["privacy"].get("ledger_id"), int(message["version"]) + 1)

    def _drain(self) -> bool:
        """Apply every batch in flight; whether there was one."""
        drained = bool(self._inflight)
        while self._inflight:
            self._apply_next()
        return drained

    def _settle(self) -> None:
        """Apply every batch in flight and commit."""
        if self._drain():
            self._commit()

    def _before_revoke(self) -> dict | None:
        """The source's rebalance hook: with kafka-python it runs on the consumer's IO thread while
        this loop waits in ``poll()``, with confluent-kafka inside ``poll()`` on this thread; apply the batch in
        flight and return the positions to commit (none when a dead letter is unconfirmed: the loop then stops)."""
        try:
            self._drain()  # its batch's dead letters are confirmed as it is applied
            self._confirm_dead_letters()
        except DeadLetterError:  # recorded: the loop raises it at its next commit
            return None
        if self._applied and self._checkpoint is not None:  # the next owner starts after these records
            self._checkpoint.save(self.learner, self._applied)
        return self._applied

    def _check_source(self) -> None:
        """At start and every ``source_check_s``: the partitions a partitioned source (Kafka)
        holds and the input topics that are missing, as metrics and, while a problem lasts, a
        WARNING at each check. Holding no partition is only a problem from the second check on
        (joining the group takes a moment)."""
        if not isinstance(self.source, PartitionedSource):
            return
        now = time.monotonic()
        if self._source_check_at is not None and now < self._source_check_at:
            return
        first = self._source_check_at is None
        self._source_check_at = now + self.source_check_s
        try:
            cover = self.source.coverage()
        except Exception as exc:  # metadata unavailable right now: the next poll reports real failures
            log.warning("could not check the source's partitions: %s", exc)
            return
        m = self.metrics
        m.source_partitions.set(cover.held)
        for topic in cover.topics:
            m.source_topic_missing.labels(topic=topic).set(int(topic in cover.missing))
        problem = cover.problem()
        if problem is not None and (cover.missing or not first):
            log.warning("the source %s; runbook: docs/deploy.md#%s", problem,
                        "streamvipsinputtopicmissing" if cover.missing else "streamvipsnoinputpartitions")
        self._export_lag()

    def _export_lag(self) -> None:
        """Set ``consumer_lag_records`` for sources that know their lag (Kafka); a count only."""
        if not isinstance(self.source, LagReporting):
            return
        for (topic, partition), behind in self.source.lag().items():
            self.metrics.consumer_lag.labels(topic=topic, partition=str(partition)).set(behind)

    def _time_due(self) -> bool:
        return self.learner.time_due()

    # ------------------------------------------------------------------------------------------

    def ingest(self, raws: Sequence[RawRecord]) -> None:
        """Decode, validate, dead-letter and reservoir one polled batch (in this process)."""
        values = values_of(raws)
        admitted = self.learner.validation == "admitted"
        self._apply(raws, None if admitted else decode_batch(self.model, values), values)

    def _apply(self, raws: Sequence[RawRecord], batch: DecodedBatch | None, values: list[bytes]) -> None:
        """Dead-letter the rejects and offer every arrival to the learner, which steps on its
        trigger (after a stop signal the rest of the batch still enters the reservoir, since it
        is committed, but no new step starts). ``batch`` ``None`` (``sampling.validation:
        admitted``): the learner decodes the arrivals its reservoir admits, and only those can
        be rejected."""
        n = len(raws)
        self.stats.records += n
        self.metrics.records_consumed.inc(n)
        keys = None
        if self.learner.unit == "key":  # privacy rule 12: the key field wins over the message key
            message_keys = (raws.origin_field("key") if isinstance(raws, RecordBatch)
                            else [raw.origin.get("key") for raw in raws])
            keys = self.learner.arrival_keys(values, message_keys)
        # Rejects known before the batch is offered go to the sink first: a refused send stops
        # the run before any of the batch's steps is paid.
        if batch is None:
            early = keys.missing() if keys is not None else []
            if early:
                self._dead_letter(raws, early)
            # the rest are known once the reservoir admits (and decodes) them: sent before any
            # step that follows their decoding
            batch = self.learner.offer_raw(values, stop=self._no_step, on_step=self._released, keys=keys,
                                           on_rejected=lambda found: self._dead_letter(raws, found))
            self.stats.not_decoded += batch.skipped
            self.metrics.records_not_decoded.inc(batch.skipped)
        else:
            if keys is not None:
                batch = reject_keyless(batch, keys)
            if batch.rejected:
                self._dead_letter(raws, batch.rejected)
            batch = self.learner.offer(batch, stop=self._no_step, on_step=self._released, keys=keys)
        self.stats.accepted += int(np.count_nonzero(batch.ok))
        self._after_steps()
        self.metrics.reservoir_records.set(self.reservoir.size)

    def _dead_letter(self, raws: Sequence[RawRecord], rejected: list[tuple[int, str, str]]) -> None:
        reasons = collections.Counter(reason for _, reason, _ in rejected)
        cap = self.dead_letter_max_bytes
        try:
            self.dead_letter.send([DeadLetter.bounded(raws[i], reason, detail, cap) for i, reason, detail in rejected])
        except Exception as exc:  # a refused send (full disk, producer error): the run stops, nothing committed
            self._dead_letter_failure = exc
        # confirmed before the learner sees the batch: a letter the broker refuses later (a topic
        # limit, lost in-sync replicas) would otherwise stop the run after the batch's steps were paid
        self._confirm_dead_letters()
        for reason, n in reasons.items():
            self.metrics.records_rejected.labels(reason=reason).inc(n)
        self.stats.rejected.update(reasons)

    def _step(self) -> None:
        """A time-triggered step (``every_seconds``)."""
        result = self.learner.step()
        if result is not None:
            self._released(result)
        self._after_steps()

    def _released(self, result: StepResult) -> None:
        """Metrics and (at most every ``publish_interval_s``) a message for one released step."""
        m = self.metrics
        m.updates.inc()
        m.update_duration.observe(result.duration_s)
        m.last_update_timestamp.set(time.time())
        self.stats.updates += 1
        self._unpublished = True
        if time.monotonic() - self._last_publish >= self.publish_interval_s:
            self._publish_latest(retry=True)

    def _after_steps(self) -> None:
        self.stats.skipped_steps = self.learner.skipped_steps
        if self.halted and not self.stats.halted:
            self._halt()

    def _no_step(self) -> bool:
        """No new step starts: a stop was asked for, or a paid step's model has not gone out."""
        return self._stop.is_set() or self._publish_failures > 0

    def _publish_latest(self, halted: bool = False, retry: bool = False) -> None:
        """Publish the learner's newest model (version = its ledger step) with the ledger's epsilon.

        ``retry``: a failure does not end the run. A run that died on it would be restarted, pay
        a new step and fail again, draining the budget with nothing released; instead the source
        is paused, no step starts, and the publish is retried (backoff 1 s doubling to 60 s) until
        it goes out (then the source resumes) or the service is stopped (the last publish then
        raises :class:`PublishError`). Only the step already paid is at stake."""
        message = self.learner.message(halted=halted)
        if message is None:
            return
        try:
            self._publish(message)
        except PublishError:
            if not retry:
                raise
            if not self._publish_failures:
                self.source.pause()
                log.error("no step until model version %s is published; retrying", message.get("version"))
            self._publish_failures += 1
            self._publish_retry_at = time.monotonic() + min(2.0 ** (self._publish_failures - 1), 60.0)
            return
        if self._publish_failures:
            log.warning("model version %s published after %d failed attempts; resuming",
                        message.get("version"), self._publish_failures)
            self._publish_failures = 0
            self.source.resume()
        self._unpublished = False
        self._last_publish = time.monotonic()
        self.metrics.epsilon_spent.set(self.engine.epsilon_spent())
        self.metrics.model_version.set(message["version"])

    def _publish(self, message: dict[str, Any]) -> None:
        try:
            self.sink.publish(self.model_id, message)
        except Exception as exc:
            self.metrics.publish_failures.inc()
            log.error("publishing model version %s failed: %s", message.get("version"), exc)
            raise PublishError(f"publishing model version {message.get('version')} failed: {exc}") from exc
        self.stats.published += 1
        self.stats.last_message = message

    def _halt(self) -> None:
        """No more updates (the budget is spent, or the reservoir holds mostly rejected arrivals):
        the last model stays published, marked halted."""
        self.stats.halted = True
        self.stats.halt_reason = self.learner.halt_reason
        self.stats.halt_cause = self.learner.halt_cause
        self.metrics.halted.set(1)
        self.metrics.halt_cause.labels(cause=self.stats.halt_cause).set(1)
        self.metrics.epsilon_spent.set(self.engine.epsilon_spent())
        if self.stats.halt_cause == "budget":  # the planned end (the learner logged a data halt itself)
            log.info("privacy budget spent, updates halted for good: %s", self.stats.halt_reason)
        self.source.pause()
        if self.engine.last_step is not None:
            self._publish_latest(halted=True)
            self.sink.flush()

    # ------------------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {}

        def handler(signum: int, frame: Any) -> None:
            log.info("received %s: finishing the step in flight and shutting down", signal.Signals(signum).name)
            self.stats.stopped_by_signal = True
            self._stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)

        def restore() -> None:
            for sig, old in previous.items():
                signal.signal(sig, old)

        return restore

    def _close_ledger(self) -> None:
        self.learner.settle()  # a write paid ahead lands (or fails) before the ledger closes
        if self.ledger is not None:
            self.ledger.close()

    def _shutdown(self) -> None:
        self.metrics.set_ready(False)
        errors = []
        for name, action in (
            ("sink flush", self.sink.flush),
            ("dead-letter flush", self.dead_letter.flush),
            ("source close", self.source.close),
            ("sink close", self.sink.close),
            ("dead-letter close", self.dead_letter.close),
            ("decoder close", self._decoder.close),
            ("ledger close", self._close_ledger),
        ):
            try:
                action()
            except Exception as exc:  # close everything even when one part fails
                errors.append(f"{name}: {exc}")
        if self._server is not None:
            self._server.close()
            self._server = None
        if errors:
            log.error("errors during shutdown: %s", "; ".join(errors))
