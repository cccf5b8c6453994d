"""Prometheus metrics on a private registry, served with ``/metrics``, ``/healthz`` and ``/readyz``.

Only privatized quantities, configuration and what the guarantee treats as public are exported
(privacy rules 1 and 8 in docs/privacy.md): counts of records consumed and rejected (stream volume
and validity are public), reservoir fill, update counts, the accountant's epsilon, the budget, the
model version, and the timing of updates. Never a statistic of the data.

The two timing metrics, ``update_duration_seconds`` and ``last_update_timestamp_seconds``, are
**outside the privacy guarantee**: a step's wall time depends on the realised batch (a Poisson
batch's size) and on data-dependent work behind the wall (e.g. E-step iterations to a
tolerance), and they are exported unnoised. docs/privacy.md lists update timing as public; their
help texts say so, and a deployment that needs timing covered must not scrape them.

Each :class:`Metrics` owns its :class:`prometheus_client.CollectorRegistry`, so several
applications (tests, the demo's non-private comparison run) live in one process. The registry also
carries prometheus_client's process, platform and garbage-collector collectors (``process_*``,
``python_info``, ``python_gc_*``), the usual operational series. Like update timing they are
unnoised and **outside the privacy guarantee**: CPU time, memory and collections depend on the
data-dependent work behind the wall, so they reveal no more than the timing metrics already do.

>>> m = Metrics(family="linreg", sampling="poisson", accountant="pld")
>>> m.records_consumed.inc(3)
>>> b"stream_vips_records_consumed_total 3.0" in m.exposition()
True
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from stream_vips import __version__
from stream_vips.errors import ConfigError

PREFIX = "stream_vips"
#: Help-text note of the metrics that expose update timing (public, not covered by the guarantee).
TIMING_CAVEAT = ("Outside the privacy guarantee: unnoised, depends on the realised batch and on data-dependent "
                 "E-step work (update timing is public, privacy rule 1 in docs/privacy.md).")
UPDATE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The application's metrics (names in docs/architecture.md) plus liveness/readiness state."""

    def __init__(self, family: str = "", sampling: str = "", accountant: str = "",
                 health_timeout_s: float = 30.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # process_* (CPU, memory, fds, start time), python_info and python_gc_*: what dashboards
        # and alerts expect of any process; the private registry would otherwise lack them
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.records_consumed = Counter(f"{PREFIX}_records_consumed", "Records read from the source.", registry=r)
        self.records_duplicate = Counter(
            f"{PREFIX}_records_duplicate", "Records dropped because this process had already taken their "
            "offsets (a partition handed back after a rebalance); never put in the reservoir twice.", registry=r)
        self.records_not_decoded = Counter(
            f"{PREFIX}_records_not_decoded", "Records the reservoir did not admit, so never decoded "
            "(sampling.validation: admitted); rejections cover the decoded ones only.", registry=r)
        self.records_rejected = Counter(
            f"{PREFIX}_records_rejected", "Records rejected to the dead-letter sink, by reason code.", ["reason"],
            registry=r,
        )
        self.reservoir_records = Gauge(f"{PREFIX}_reservoir_records", "Records currently held in the reservoir.",
                                       registry=r)
        self.reservoir_capacity = Gauge(f"{PREFIX}_reservoir_capacity", "Reservoir capacity M (public).", registry=r)
        self.updates = Counter(f"{PREFIX}_updates", "Private updates released.", registry=r)
        self.update_duration = Histogram(
            f"{PREFIX}_update_duration_seconds", "Wall time of one private update step. " + TIMING_CAVEAT,
            buckets=UPDATE_BUCKETS, registry=r
        )
        self.epsilon_spent = Gauge(f"{PREFIX}_epsilon_spent", "Privacy loss epsilon spent so far (from the ledger).",
                                   registry=r)
        self.epsilon_budget = Gauge(f"{PREFIX}_epsilon_budget", "Configured epsilon budget.", registry=r)
        self.delta = Gauge(f"{PREFIX}_delta", "Configured delta.", registry=r)
        self.halted = Gauge(f"{PREFIX}_halted", "1 when updates halted for good (why: stream_vips_halt_cause).",
                            registry=r)
        self.halt_cause = Gauge(
            f"{PREFIX}_halt_cause", "1 for the reason updates halted: budget (the planned end: no further step "
            "fits the privacy budget) or rejected_data (the reservoir holds mostly rejected arrivals).", ["cause"],
            registry=r)
        self.source_partitions = Gauge(
            f"{PREFIX}_source_partitions", "Input partitions the source holds (Kafka; checked every "
            "runtime.source_check_s): 0 means nothing is consumed.", registry=r)
        self.source_topic_missing = Gauge(
            f"{PREFIX}_source_topic_missing", "1 for an input topic that does not exist (or that the source's user "
            "may not describe): nothing is consumed from it.", ["topic"], registry=r)
        self.model_version = Gauge(f"{PREFIX}_model_version", "Version (ledger step) of the last published model.",
                                   registry=r)
        self.last_update_timestamp = Gauge(
            f"{PREFIX}_last_update_timestamp_seconds", "Unix time of the last released update. " + TIMING_CAVEAT,
            registry=r
        )
        self.publish_failures = Counter(f"{PREFIX}_publish_failures", "Model messages that failed to publish.",
                                        registry=r)
        self.consumer_lag = Gauge(
            f"{PREFIX}_consumer_lag_records", "Records behind the end of the source partition.", ["topic", "partition"],
            registry=r,
        )
        self.build_info = Info(f"{PREFIX}_build", "Version and configuration of this process.", registry=r)
        self.build_info.info({"version": __version__, "family": family, "sampling": sampling, "accountant": accountant})
        self.model_version.set(-1)
        self.health_timeout_s = float(health_timeout_s)
        self._last_tick = time.monotonic()
        self._ready = False

    def exposition(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)

    def tick(self) -> None:
        """Called by the run loop on every iteration; ``/healthz`` fails when ticks stop."""
        self._last_tick = time.monotonic()

    def set_ready(self, ready: bool) -> None:
        self._ready = bool(ready)

    @property
    def alive(self) -> bool:
        return time.monotonic() - self._last_tick <= self.health_timeout_s

    @property
    def ready(self) -> bool:
        return self._ready


class ShardSeries:
    """The per-shard series of a sharded run (privacy rule 14), on ``metrics``' registry: what
    each shard read, accepted and dead-lettered, its slice's fill, the steps abandoned before
    anything was spent, and the wall time of each phase of a step (plan, gather, release).
    Public counts and timing only, as for one process; the phase timings carry
    :data:`TIMING_CAVEAT`.

    The shards report counts since they started (a shard's position comes back from its
    checkpoint, its other counts from zero); a count that goes down is a restarted shard and
    becomes the new baseline, so the counters only ever add what was read since."""

    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.metrics = metrics
        self.records = Counter(f"{PREFIX}_shard_records", "Records a shard read from its input partitions.",
                               ["shard"], registry=r)
        self.accepted = Counter(f"{PREFIX}_shard_records_accepted", "Records of a shard that decoded and validated.",
                                ["shard"], registry=r)
        self.dead_letters = Counter(f"{PREFIX}_shard_dead_letters", "Rejected records a shard delivered to the "
                                    "dead-letter sink.", ["shard"], registry=r)
        self.reservoir = Gauge(f"{PREFIX}_shard_reservoir_records", "Records in a shard's reservoir slice.",
                               ["shard"], registry=r)
        self.capacity = Gauge(f"{PREFIX}_shard_reservoir_capacity", "A shard's slice of the reservoir, M_i "
                              "(public).", ["shard"], registry=r)
        self.phase = Histogram(f"{PREFIX}_step_phase_duration_seconds", "Wall time of one phase of a sharded "
                               "step: plan (the sampling plan), gather (the shards' clipped sums), release (noise, "
                               "ledger, M-step). " + TIMING_CAVEAT, ["phase"], buckets=UPDATE_BUCKETS, registry=r)
        self.abandoned = Counter(f"{PREFIX}_steps_abandoned", "Steps a sharded run abandoned before spending "
                                 "anything: a shard failed, answered later than runtime.shard_timeout_s, or "
                                 "came back from a restart with its slice not full.", registry=r)
        self._last: dict[int, tuple[int, int, int, dict[str, int]]] = {}
        self._abandoned = 0

    def observe_shard(self, index: int, records: int, accepted: int, dead_letters: int, held: int, capacity: int,
                      rejected: Mapping[str, int] | None = None) -> None:
        """One shard's counts since it started (and its rejections by reason), its slice's fill."""
        label = str(index)
        before = self._last.get(index, (0, 0, 0, {}))
        for counter, now, then in ((self.records, records, before[0]), (self.accepted, accepted, before[1]),
                                   (self.dead_letters, dead_letters, before[2])):
            if now > then:
                counter.labels(shard=label).inc(now - then)
                if counter is self.records:
                    self.metrics.records_consumed.inc(now - then)
            else:
                counter.labels(shard=label)  # the series exists from the start
        reasons = dict(rejected or {})
        for reason, count in reasons.items():
            if count > before[3].get(reason, 0):
                self.metrics.records_rejected.labels(reason=reason).inc(count - before[3].get(reason, 0))
        self._last[index] = (records, accepted, dead_letters, reasons)
        self.reservoir.labels(shard=label).set(held)
        self.capacity.labels(shard=label).set(capacity)

    def observe_abandoned(self, steps: int) -> None:
        """The driver's count of abandoned steps (since it started)."""
        if steps > self._abandoned:
            self.abandoned.inc(steps - self._abandoned)
        self._abandoned = steps

    def observe_phases(self, phases: Mapping[str, float]) -> None:
        """The wall time of each phase of one released step."""
        for phase, seconds in phases.items():
            self.phase.labels(phase=phase).observe(seconds)


def _handler(metrics: Metrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, metrics.exposition(), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok = metrics.alive
                self._reply(200 if ok else 503, b"ok\n" if ok else b"run loop stalled\n")
            elif path == "/readyz":
                ok = metrics.ready
                self._reply(200 if ok else 503, b"ready\n" if ok else b"not ready\n")
            else:
                self._reply(404, b"not found\n")

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line
            pass

    return Handler


#: Bind errors that mean the host, not the port, is wrong: no such address on this machine, or
#: an address family (IPv6) the machine lacks.
_HOST_ERRNOS = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


def bind_error(host: str, port: int, exc: OSError) -> ConfigError:
    """The ``ConfigError`` for a failed bind of the metrics server, naming ``metrics.host`` when
    the host is the problem (not resolvable, or no interface of this machine) and
    ``metrics.port`` otherwise (in use, privileged).

    >>> import socket
    >>> str(bind_error("nohost.invalid", 9108, socket.gaierror(-2, "Name or service not known")))
    'metrics.host: cannot serve metrics on nohost.invalid:9108: Name or service not known'
    """
    key = "metrics.host" if isinstance(exc, socket.gaierror) or exc.errno in _HOST_ERRNOS else "metrics.port"
    return ConfigError(f"{key}: cannot serve metrics on {host}:{port}: {exc.strerror or exc}")


def port_free(host: str, port: int) -> None:
    """Raise ``ConfigError`` (see :func:`bind_error`) when ``host:port`` cannot be bound now (a
    start fails before it creates a ledger or anything else; port 0 binds whenever the host is
    valid)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds
            sock.bind((host, port))
    except OSError as exc:
        raise bind_error(host, port, exc) from None


class MetricsServer:
    """Serves a :class:`Metrics` over HTTP from a daemon thread. ``port=0`` binds a free port."""

    def __init__(self, metrics: Metrics, host: str = "0.0.0.0", port: int = 9108) -> None:
        self._server = ThreadingHTTPServer((host, port), _handler(metrics))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The bound port (useful with ``port=0``)."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
