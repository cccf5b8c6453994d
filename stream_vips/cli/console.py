"""What ``stream-vips run`` tells its user: a start-up block, progress, warnings and a summary.

All of it reads public quantities only: configuration, counts of records (valid or not),
positions, the ledger's epsilon (privacy rule 1 and 8 in docs/privacy.md).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, TextIO

from stream_vips.io import FiniteSource
from stream_vips.service.app import Application, RunStats


def _where(kind: str, conn: Any) -> str:
    options = conn.options
    target = options.get("path") or options.get("topic") or options.get("topics") or ""
    return f"{conn.type} {target}".strip()


def startup_lines(app: Application, config: Any) -> list[str]:
    """The start-up block: model, sampling, noise, budget, plan, where everything goes."""
    cfg, engine = config, app.engine
    lines = [f"model          {cfg.model.family} (id {cfg.model.id}), reservoir M = {app.reservoir.capacity}"]
    schedule = []
    if cfg.schedule.every_records is not None:
        schedule.append(f"every {cfg.schedule.every_records} records")
    if cfg.schedule.every_seconds is not None:
        schedule.append(f"every {cfg.schedule.every_seconds:g} s")
    lines.append(f"sampling       {engine.sampler.name}, q = {engine.q:.4g} (batch {cfg.sampling.batch_size}), "
                 f"an update {' or '.join(schedule)}")
    if engine.non_private:
        lines.append("privacy        NONE (privacy.mode: non_private): no noise, no guarantee")
    else:
        monitor = engine.monitor
        ledger = app.ledger
        where = cfg.privacy.ledger.path if cfg.privacy.ledger.type == "file" else cfg.privacy.ledger.type
        lines += [
            f"noise          z = {engine.noise_multiplier:.4g} "
            f"(paper sigma {engine.noise_multiplier / engine.diameter:.4g}), "
            f"accountant {engine.accountant_name}",
            f"budget         epsilon {monitor.epsilon_budget:g}, delta {monitor.delta:g}, planned steps "
            f"{cfg.privacy.planned_steps}; spent so far {monitor.spent():.4g} in {monitor.steps} ledger steps",
            f"ledger         {where} (id {ledger.ledger_id})",
            f"guarantee      per {'key' if app.learner.unit == 'key' else 'record'}"
            + (f" (at most {cfg.privacy.max_records_per_key} records of one key)" if app.learner.unit == "key" else "")
            + (f", window accounting over L = {app.learner.window_steps} steps (the service keeps learning)"
               if app.learner.window_steps else ", over the whole stream (updates halt when the budget is spent)"),
        ]
        if engine.seeded:
            lines.append("seeded         yes: the noise is reproducible and gives NO guarantee (tests and demos only)")
    lines += [f"source         {_where('source', cfg.source)}",
              f"models to      {_where('sink', cfg.sink)}",
              f"dead letters   {_where('dead_letter', cfg.dead_letter)}"]
    if cfg.runtime.checkpoint_path:
        lines.append(f"checkpoint     {cfg.runtime.checkpoint_path} "
                     f"(at most every {cfg.runtime.checkpoint_interval_s:g} s)")
    if app.metrics_port is not None:
        host = app.metrics_address[0] if app.metrics_address else "0.0.0.0"
        lines.append(f"metrics        http://{host}:{app.metrics_port}/metrics")
    else:
        lines.append("metrics        not served (metrics.enabled: false)")
    return lines


def expected_steps(records: int, reservoir: int, every_records: int | None) -> int | None:
    """Updates a source of ``records`` arrivals can trigger: the first once the reservoir is full
    and ``every_records`` arrivals have passed, then one per ``every_records``."""
    if every_records is None:
        return None
    first = max(reservoir, every_records)
    return 0 if records < first else (records - first) // every_records + 1


def startup_warnings(app: Application, config: Any) -> list[str]:
    """What an operator should fix before relying on the run: Kafka settings that make restarts
    slow or block readers, and a finite source that leaves the budget unspent."""
    out = []
    if config.source.type == "kafka" and not config.source.options.get("group_instance_id"):
        out.append("source.group_instance_id is not set: a restarted member waits for the group's session "
                   "timeout before it consumes again (static membership makes the rejoin immediate)")
    if config.sink.type == "kafka" and not config.sink.options.get("transactional_id"):
        out.append("sink.transactional_id is not set: a crashed publisher's open transaction blocks "
                   "read-committed readers until it times out (a stable id aborts it at the next start)")
    return out + budget_warnings(app, config)


def budget_warnings(app: Application, config: Any) -> list[str]:
    """Warnings for a finite source that cannot reach the planned steps (budget left unspent)."""
    if app.engine.non_private or not isinstance(app.source, FiniteSource):
        return []
    total = app.source.total()
    if total is None:
        return []
    cfg = config
    if cfg.schedule.every_seconds is not None:
        return []
    steps = expected_steps(total, app.reservoir.capacity, cfg.schedule.every_records)
    planned = cfg.privacy.planned_steps
    if steps == 0:
        needed = max(app.reservoir.capacity, cfg.schedule.every_records)
        return [f"the source has {total} records, fewer than the {needed} "
                "needed before the first update (sampling.reservoir, schedule.every_records): no model will be "
                "released; lower them, or use `stream-vips fit` for a finite data set"]
    if steps is not None and steps < planned:
        monitor = app.engine.monitor
        event = app.engine.event()
        reachable = monitor.accountant.epsilon([event] * steps, monitor.delta)
        if reachable < 0.5 * monitor.epsilon_budget:
            return [f"the source has {total} records: {steps} updates of the {planned} planned "
                    f"(privacy.planned_steps), spending about epsilon {reachable:.3g} of {monitor.epsilon_budget:g}; "
                    f"set privacy.planned_steps: {steps} to spend the budget, or use `stream-vips fit`"]
    return []


class Progress:
    """Progress while running: a line redrawn in place on a terminal, a plain line every
    ``every_s`` seconds otherwise (logs). The rate is over the time since the previous line, so
    an idle source shows 0/s rather than a lifetime average that decays slowly."""

    def __init__(self, stream: TextIO | None = None, every_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = float(every_s)
        self._last = float("-inf")
        self._since: tuple[float, int] = (time.monotonic(), 0)  # (time, records) of the previous line

    def line(self, app: Application) -> str:
        s = app.stats
        now = time.monotonic()
        then, records = self._since
        rate = (s.records - records) / max(now - then, 1e-9)
        self._since = (now, s.records)
        eps = app.engine.epsilon_spent()
        budget = "" if app.engine.non_private else f" of {app.engine.monitor.epsilon_budget:g}"
        return (f"{s.records} records ({sum(s.rejected.values())} rejected), {rate:,.0f}/s, "
                f"{s.updates} updates, epsilon {eps:.4g}{budget}{', HALTED' if s.halted else ''}")

    def __call__(self, app: Application) -> None:
        now = time.monotonic()
        if now - self._last < (0.2 if self.tty else self.every_s):
            return
        self._last = now
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line(app))
        else:
            self.stream.write(f"progress: {self.line(app)}\n")
        self.stream.flush()

    def finish(self, app: Application) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line(app) + "\n")
            self.stream.flush()


def summary(app: Application, stats: RunStats, seconds: float) -> dict[str, Any]:
    """The final summary (also written as JSON with ``--json-summary``)."""
    engine = app.engine
    private = not engine.non_private
    eps = engine.epsilon_spent()
    out: dict[str, Any] = {
        "model_id": app.model_id,
        "family": app.model.family,
        "records": stats.records,
        "records_rejected": sum(stats.rejected.values()),
        "rejected_by_reason": dict(stats.rejected),
        "updates": stats.updates,
        "skipped_steps": stats.skipped_steps,
        "duplicates_dropped": stats.duplicates,
        "published": stats.published,
        "last_version": engine.last_step,
        "private": private,
        "epsilon_spent": eps if private and math.isfinite(eps) else None,
        "epsilon_budget": engine.monitor.epsilon_budget if private else None,
        "delta": engine.monitor.delta if private else None,
        "noise_multiplier": engine.noise_multiplier,
        "ledger_id": app.ledger.ledger_id if private else None,
        "halted": stats.halted,
        "halt_reason": stats.halt_reason,
        "halt_cause": stats.halt_cause,
        "stopped_by_signal": stats.stopped_by_signal,
        "metrics_port": app.metrics_port,
        "seconds": round(seconds, 3),
    }
    if stats.updates == 0 and not stats.halted:
        out["no_update_because"] = (
            f"the reservoir holds {app.reservoir.size} of {app.reservoir.capacity} records: no update until it is full"
            if not app.reservoir.full else "the trigger did not fire again before the source ended")
    return out


def format_summary(s: dict[str, Any]) -> str:
    """Human-readable summary lines."""
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s["rejected_by_reason"].items())) or "none"
    eps = ("none (non-private run: no guarantee)" if not s["private"]
           else f"{s['epsilon_spent']:.4g} of budget {s['epsilon_budget']:g} (delta {s['delta']:g})")
    lines = [f"records        {s['records']} ({s['records_rejected']} rejected: {reasons})",
             f"updates        {s['updates']} (last model version {s['last_version']})",
             f"epsilon spent  {eps}"]
    if s["halted"]:
        lines.append(f"halted         {s['halt_reason']}")
    if s.get("no_update_because"):
        lines.append(f"no update      {s['no_update_because']}")
    if s["skipped_steps"]:
        lines.append(f"skipped        {s['skipped_steps']} trigger points an earlier run had already paid for")
    if s["duplicates_dropped"]:
        lines.append(f"duplicates     {s['duplicates_dropped']} records dropped (offsets already taken)")
    lines.append(f"wall time      {s['seconds']:.2f} s{' (stopped by a signal)' if s['stopped_by_signal'] else ''}")
    return "\n".join(lines)
