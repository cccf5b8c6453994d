"""``stream-vips run`` with ``runtime.shards`` > 1 or ``runtime.engine: ray``: the sharded service.

The shards read their partitions and hold the reservoir slices; the driver
(:class:`~stream_vips.distributed.ShardedLearner`) releases, writes the one ledger and publishes
(privacy rule 14 in docs/privacy.md). This module is the operator's side of it, as
:mod:`stream_vips.cli.run` and :mod:`stream_vips.cli.console` are for one process: the start
(every part built or refused before anything is spent), progress lines and the summary with
per-shard counts, the metrics (the service's registry plus
:class:`~stream_vips.service.metrics.ShardSeries`), SIGTERM/SIGINT, ``runtime.on_halt`` and the
exit codes of :data:`stream_vips.cli.run.EXIT_CODES` where they apply. Everything shown is
public: counts of records, slice fill, positions, the ledger's epsilon, timing.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from stream_vips.distributed import ShardedLearner, ShardPool, make_pool
from stream_vips.distributed.shard import ShardStatus
from stream_vips.service import build
from stream_vips.service.metrics import Metrics, MetricsServer, ShardSeries, bind_error, port_free

log = logging.getLogger("stream_vips.cli.sharded")


@dataclass
class ShardedService:
    """A started sharded run: the pool, the driver and the connectors it closes."""

    config: Any
    pool: ShardPool
    learner: ShardedLearner
    sink: Any
    ledger: Any
    metrics: Metrics
    series: ShardSeries
    stopped_by_signal: bool = False
    metrics_port: int | None = None
    _server: MetricsServer | None = field(default=None, repr=False)
    _publish_failures: int = field(default=0, repr=False)  # the driver's run of failures last observed

    def close(self) -> None:
        """Close everything that was opened, whatever fails (the ledger last)."""
        for action in (self.learner.close, self.pool.close, self.sink.close,
                       self.ledger.close if self.ledger is not None else None):
            if action is None:
                continue
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - close the rest
                print(f"stream-vips: closing: {type(exc).__name__}: {exc}", file=sys.stderr)
        if self._server is not None:
            self._server.close()
            self._server = None


def start(config: Any, sink: Any = None) -> ShardedService:
    """Build the sharded run of ``config``: connectors (refused at start, naming the key), the
    metrics port, Ray (``runtime.engine: ray``), the pool, the sink, the ledger and the driver.
    Whatever was built is closed again when a later part fails."""
    sources, dead_letters = build.shard_connectors(config)
    if config.metrics.enabled:
        port_free(config.metrics.host, config.metrics.port)
    if config.runtime.engine == "ray":
        import ray

        # RAY_ADDRESS (a KubeRay cluster) or a local one; the shards ask for no CPU of their own
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False, configure_logging=False)
    opened: list[Any] = []
    try:
        pool = make_pool(config, sources=sources, dead_letters=dead_letters)
        opened.append(pool)
        sink = sink if sink is not None else build.connector("sink", config)
        opened.append(sink)
        ledger = build.ledger(config) if config.privacy.mode != "non_private" else None
        if ledger is not None:
            opened.append(ledger)
        learner = ShardedLearner(config, pool, ledger=ledger)
        opened.append(learner)
        learner.resume(sink)  # a restarted driver goes on from the model it published
    except BaseException:
        for part in reversed(opened):
            try:
                part.close()
            except Exception:  # noqa: BLE001 - the start's own error is the one to report
                pass
        raise
    engine = learner.engine
    metrics = Metrics(learner.model.family, engine.sampler.name, engine.accountant_name)
    service = ShardedService(config, pool, learner, sink, ledger, metrics, ShardSeries(metrics))
    metrics.reservoir_capacity.set(learner.slices.capacity)
    if learner.monitor is not None:
        metrics.epsilon_budget.set(learner.monitor.epsilon_budget)
        metrics.delta.set(learner.monitor.delta)
    metrics.epsilon_spent.set(learner.epsilon_spent)
    learner.on_step = lambda result, phases: _stepped(service, result.duration_s, phases)
    return service


def _stepped(service: ShardedService, duration_s: float, phases: Any) -> None:
    m = service.metrics
    m.updates.inc()
    m.update_duration.observe(duration_s)
    m.last_update_timestamp.set(time.time())
    service.series.observe_phases(phases)


def observe(service: ShardedService) -> None:
    """Export the shards' last statuses and the driver's state (after every round)."""
    learner, m = service.learner, service.metrics
    m.tick()
    for status in learner.slices.statuses:
        if status is not None:
            service.series.observe_shard(status.index, status.seen, status.accepted, status.dead_letters,
                                         status.size, status.capacity, status.rejected)
    m.reservoir_records.set(learner.slices.size)
    m.epsilon_spent.set(learner.epsilon_spent)
    service.series.observe_abandoned(learner.abandoned_steps)
    # the driver counts its failed attempts at the owed model in a row (one attempt a round, 0
    # again once it is published); the counter adds each new one, as one process's does
    failures = learner.publish_failures
    if failures > service._publish_failures:
        m.publish_failures.inc(failures - service._publish_failures)
    service._publish_failures = failures
    if learner.last_step is not None:
        m.model_version.set(learner.last_step)
    if learner.halted:
        m.halted.set(1)
        if learner.halt_cause is not None:
            m.halt_cause.labels(cause=learner.halt_cause).set(1)


def serve(service: ShardedService, progress: Callable[[ShardedService], None] | None = None) -> None:
    """Run until the sources end, updates halt or a signal arrives (SIGTERM/SIGINT finish the
    round in flight and publish the newest model); with ``runtime.on_halt: stay`` a halted run
    keeps serving metrics until a signal. Raises what the driver raises."""
    learner, cfg = service.learner, service.config
    restore = _signals(service)
    try:
        if cfg.metrics.enabled:
            try:
                service._server = MetricsServer(service.metrics, cfg.metrics.host, cfg.metrics.port)
            except OSError as exc:
                raise bind_error(cfg.metrics.host, cfg.metrics.port, exc) from exc
            service.metrics_port = service._server.port
        learner.refresh()
        observe(service)
        service.metrics.set_ready(True)

        def each_round(_: ShardedLearner) -> None:
            observe(service)
            if progress is not None:
                progress(service)

        learner.serve(service.sink, on_round=each_round)
        observe(service)
        if learner.halted and cfg.runtime.on_halt == "stay":
            while not learner.stopping:  # metrics and health stay up until a signal
                service.metrics.tick()
                time.sleep(0.2)
    finally:
        service.metrics.set_ready(False)
        restore()


def _signals(service: ShardedService) -> Callable[[], None]:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        log.info("received %s: finishing the round in flight and shutting down", signal.Signals(signum).name)
        service.stopped_by_signal = True
        service.learner.stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


# -- what the operator reads ------------------------------------------------------------------


def startup_line(service: ShardedService) -> str:
    learner, cfg = service.learner, service.config
    where = f", metrics on port {service.metrics_port}" if service.metrics_port is not None else ""
    return (f"sharded run: {service.pool.shards} shards ({cfg.runtime.engine}), reservoir slices "
            f"{learner.slices.capacities}, z = {learner.engine.noise_multiplier:.4g}{where}")


def shard_rows(statuses: list[ShardStatus | None]) -> list[dict[str, Any]]:
    """Per-shard counts: records read, accepted, the slice's fill and dead letters (public)."""
    rows: list[dict[str, Any]] = []
    for i, s in enumerate(statuses):
        if s is None:
            rows.append({"shard": i, "records": None, "accepted": None, "rejected": None, "dead_letters": None,
                         "reservoir": None, "capacity": None, "fill": None})
            continue
        rows.append({"shard": s.index, "records": s.seen, "accepted": s.accepted,
                     "rejected": sum(s.rejected.values()), "dead_letters": s.dead_letters,
                     "reservoir": s.size, "capacity": s.capacity, "fill": round(s.size / s.capacity, 4)})
    return rows


def shard_text(row: dict[str, Any]) -> str:
    if row["records"] is None:
        return f"shard {row['shard']}: no status yet"
    return (f"shard {row['shard']}: {row['records']} records, {row['accepted']} accepted, slice "
            f"{row['reservoir']}/{row['capacity']}, {row['dead_letters']} dead letters")


class ShardProgress:
    """A progress line every ``every_s`` seconds (redrawn in place on a terminal): the totals as
    for one process, then each shard's counts."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = float(every_s)
        self._last = float("-inf")
        self._since: tuple[float, int] = (time.monotonic(), 0)

    def line(self, service: ShardedService) -> str:
        learner = service.learner
        rows = shard_rows(learner.slices.statuses)
        records = sum(r["records"] or 0 for r in rows)
        now = time.monotonic()
        then, before = self._since
        rate = (records - before) / max(now - then, 1e-9)
        self._since = (now, records)
        budget = "" if learner.monitor is None else f" of {learner.monitor.epsilon_budget:g}"
        totals = (f"{records} records ({sum(r['rejected'] or 0 for r in rows)} rejected), {rate:,.0f}/s, "
                  f"{learner.steps_taken} updates, epsilon {learner.epsilon_spent:.4g}{budget}"
                  f"{', HALTED' if learner.halted else ''}")
        return "; ".join([totals] + [shard_text(r) for r in rows])

    def __call__(self, service: ShardedService) -> None:
        now = time.monotonic()
        if now - self._last < (0.2 if self.tty else self.every_s):
            return
        self._last = now
        self.stream.write(("\r\x1b[2K" if self.tty else "progress: ") + self.line(service) + ("" if self.tty else "\n"))
        self.stream.flush()

    def finish(self, service: ShardedService) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line(service) + "\n")
            self.stream.flush()


def summary(service: ShardedService, seconds: float) -> dict[str, Any]:
    """The final summary: the keys of the one-process summary, and ``shards`` with each shard's
    counts (``--json-summary``)."""
    learner = service.learner
    private = learner.monitor is not None
    eps = learner.epsilon_spent
    rows = shard_rows(learner.slices.statuses)
    rejected: dict[str, int] = {}
    for s in learner.slices.statuses:
        for reason, count in (s.rejected if s is not None else {}).items():
            rejected[reason] = rejected.get(reason, 0) + count
    out: dict[str, Any] = {
        "model_id": learner.model_id,
        "family": learner.model.family,
        "records": sum(r["records"] or 0 for r in rows),
        "records_rejected": sum(rejected.values()),
        "rejected_by_reason": rejected,
        "updates": learner.steps_taken,
        "skipped_steps": learner.skipped_steps,
        "abandoned_steps": learner.abandoned_steps,
        "duplicates_dropped": 0,
        "published": learner.published,
        "last_version": learner.last_step,
        "private": private,
        "epsilon_spent": eps if private and math.isfinite(eps) else None,
        "epsilon_budget": learner.monitor.epsilon_budget if learner.monitor is not None else None,
        "delta": learner.monitor.delta if learner.monitor is not None else None,
        "noise_multiplier": learner.engine.noise_multiplier,
        "ledger_id": learner.ledger.ledger_id if learner.ledger is not None else None,
        "halted": learner.halted,
        "halt_reason": learner.halt_reason,
        "halt_cause": learner.halt_cause,
        "stopped_by_signal": service.stopped_by_signal,
        "metrics_port": service.metrics_port,
        "seconds": round(seconds, 3),
        "engine": service.config.runtime.engine,
        "shards": rows,
    }
    if learner.steps_taken == 0 and not learner.halted:
        out["no_update_because"] = (
            f"the shards' slices hold {learner.slices.size} of {learner.slices.capacity} records: no update until "
            "every slice is full" if not learner.slices.full else "the trigger did not fire again before the sources "
            "ended")
    return out


def format_shards(s: dict[str, Any]) -> str:
    return "\n".join(f"{'shards' if i == 0 else '':<15}{shard_text(r)}" for i, r in enumerate(s["shards"]))
