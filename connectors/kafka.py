"""Kafka connectors (kafka-python): record source, model sink, dead-letter sink and durable ledger.

* :class:`KafkaSource` -- a consumer-group member with manual offset commits and bounded polls.
  While an update runs long (no ``poll()`` for ``long_update_s``) a keep-alive thread pauses the
  assigned partitions and keeps polling, so the member is not evicted for exceeding
  ``max.poll.interval.ms``; the next ``poll()`` resumes them. ``pause()`` (budget halted) pauses
  everything for good while polling keeps the membership alive. ``group_instance_id`` turns on
  static membership (a restart within the session timeout causes no rebalance).
* :class:`KafkaModelSink` -- model messages as JSON on a compacted topic keyed by model id,
  compressed by the producer (zstd, the ``zstandard`` package). A message larger than the
  topic's ``max.message.bytes`` is split into chunks sent in one transaction, so a
  ``read_committed`` reader sees all chunks or none (:func:`reassemble` puts them together).
  Every send future is checked: a failure raises :class:`KafkaPublishError`.
* :class:`KafkaDeadLetterSink` -- rejected records with their original bytes as the value and
  the reason, detail and source topic/partition/offset in headers.
* :class:`KafkaLedger` -- privacy events on a compacted topic, one key per step, written by a
  transactional producer and confirmed before ``append`` returns (privacy rule 7 in docs/privacy.md). Opening it
  fences any older writer with the same ledger id and replays the committed events.

Security settings (``security_protocol``, ``sasl_mechanism``, ``sasl_username``,
``sasl_password``, ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``) are constructor options;
unset ones fall back to ``STREAM_VIPS_KAFKA_<NAME>`` environment variables (so secrets need
not live in the YAML file). Every client reconnects with at most ``reconnect_backoff_max_ms``
(default 1 s, the Java client's default; kafka-python's own 30 s would stall recovery for half a
minute after a broker restart).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from functools import partial
from operator import attrgetter
from typing import Any, Callable, Iterable, Mapping, Sequence

from stream_vips.io import DeadLetter, RawRecord, RecordBatch
from stream_vips.logsafety import guard_client_logging
from stream_vips.privacy.ledger import (LedgerCorrupt, LedgerSteps, encode_genesis, encode_line, new_genesis,
                                        replay_lines)

log = logging.getLogger("connectors.kafka")
guard_client_logging()  # the client logs record bytes at DEBUG; every user of these connectors is guarded

SECURITY_KEYS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password",
                 "ssl_cafile", "ssl_certfile", "ssl_keyfile")
ENV_PREFIX = "STREAM_VIPS_KAFKA_"
#: Headers of a chunked model message (all chunks of one message share ``message_id``).
CHUNK_HEADER = "stream-vips-chunk"  # "<index>/<count>"
MESSAGE_ID_HEADER = "stream-vips-message-id"
SHA256_HEADER = "stream-vips-sha256"  # of the whole reassembled payload, on every chunk
#: Bytes reserved per record for key, headers and batch framing when chunking.
RECORD_OVERHEAD = 4096


class KafkaConnectorError(RuntimeError):
    """A Kafka connector cannot do what its configuration asks (names the topic and setting)."""


class KafkaPublishError(KafkaConnectorError):
    """A send was not acknowledged by the broker; nothing is dropped silently."""


def security_options(options: Mapping[str, Any] | None = None,
                     env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """kafka-python keyword arguments for the security settings (options, else environment)."""
    env = os.environ if env is None else env
    given = dict(options or {})
    out: dict[str, Any] = {}
    for key in SECURITY_KEYS:
        value = given.get(key)
        if value is None:
            value = env.get(ENV_PREFIX + key.upper())
        if value is None:
            continue
        name = {"sasl_username": "sasl_plain_username", "sasl_password": "sasl_plain_password"}.get(key, key)
        out[name] = value
    protocol = out.setdefault("security_protocol", "PLAINTEXT")
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise KafkaConnectorError(f"security_protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, got {protocol!r}")
    if protocol.startswith("SASL"):
        if "sasl_mechanism" not in out:
            raise KafkaConnectorError(f"security_protocol {protocol} needs sasl_mechanism (e.g. PLAIN, SCRAM-SHA-512)")
        if out["sasl_mechanism"] in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
                out.get("sasl_plain_username") and out.get("sasl_plain_password")):
            raise KafkaConnectorError(
                f"sasl_mechanism {out['sasl_mechanism']} needs sasl_username and sasl_password "
                f"(options or {ENV_PREFIX}SASL_USERNAME / {ENV_PREFIX}SASL_PASSWORD)")
    return out


def _servers(bootstrap_servers: str | Sequence[str]) -> list[str]:
    servers = [bootstrap_servers] if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
    servers = [s.strip() for part in servers for s in part.split(",") if s.strip()]
    if not servers:
        raise KafkaConnectorError("bootstrap_servers is empty")
    return servers


def ensure_topic(bootstrap_servers: str | Sequence[str], topic: str, *, partitions: int = 1,
                 replication_factor: int = 1, configs: Mapping[str, str] | None = None,
                 create: bool = True, security: Mapping[str, Any] | None = None,
                 min_replication: int = 1) -> dict[str, str]:
    """Create ``topic`` with ``configs`` if allowed and missing, else check its settings.

    An existing topic with fewer than ``min_replication`` replicas on some partition is refused
    too (the ledger's durability rule).

    An existing topic whose value for one of ``configs`` differs raises
    :class:`KafkaConnectorError` naming the setting (a model topic that is not compacted would
    lose nothing at first and the history later; refusing to start is the safe answer). Returns
    the topic's effective settings for the checked keys.
    """
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    wanted = {k: str(v) for k, v in (configs or {}).items()}
    admin = KafkaAdminClient(bootstrap_servers=_servers(bootstrap_servers), **dict(security or {}))
    try:
        existing = set(admin.list_topics())
        if topic not in existing:
            if not create:
                raise KafkaConnectorError(f"topic {topic!r} does not exist and create_topic is false")
            try:
                admin.create_topics([NewTopic(topic, partitions, replication_factor, topic_configs=wanted)])
            except TopicAlreadyExistsError:
                pass  # created concurrently: check its settings below
            except KafkaError as exc:
                raise KafkaConnectorError(f"cannot create topic {topic!r} with replication factor "
                                          f"{replication_factor}: {type(exc).__name__}") from exc
        if not wanted:
            return {}
        deadline = time.monotonic() + 10.0
        while True:  # a topic created a moment ago may be described with no settings at all yet
            res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            actual = _config_values(res, topic)
            if actual or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        replicas = min_replication if min_replication <= 1 else min(
            (len(p.get("replica_nodes", ())) for t in admin.describe_topics([topic]) for p in t.get("partitions", ())),
            default=0)
    finally:
        admin.close()
    if replicas < min_replication:
        raise KafkaConnectorError(f"topic {topic!r} has {replicas} replica(s) on some partition; "
                                  f"at least {min_replication} are needed")
    wrong = {k: (v, actual.get(k)) for k, v in wanted.items() if k in _CHECKED and not _same(k, v, actual.get(k))}
    if wrong:
        detail = ", ".join(f"{k}={have!r} (needs {want!r})" for k, (want, have) in sorted(wrong.items()))
        raise KafkaConnectorError(f"topic {topic!r} exists with incompatible settings: {detail}")
    return {k: actual.get(k) for k in wanted}


_CHECKED = ("cleanup.policy", "max.message.bytes", "min.insync.replicas")
_AT_LEAST = ("max.message.bytes", "min.insync.replicas")  # a larger value serves as well


def _same(key: str, want: str, have: str | None) -> bool:
    if have is None:
        return False
    if key in _AT_LEAST:
        return int(have) >= int(want)
    return set(have.split(",")) == set(want.split(","))


def _config_values(response: Any, topic: str) -> dict[str, str]:
    """``{name: value}`` for ``topic`` from kafka-python's describe_configs result."""
    entries = response.get("topic", {}).get(topic, {})
    return {name: entry.get("value") for name, entry in entries.items()}


def _retriable(exc: BaseException) -> bool:
    """True when the Kafka error behind ``exc`` is transient (a broker away, a timeout)."""
    from kafka.errors import KafkaTimeoutError

    cause = exc.__cause__ or exc
    return isinstance(cause, KafkaTimeoutError) or bool(getattr(cause, "retriable", False))


def _check_future(future: Any, timeout_s: float, what: str) -> Any:
    try:
        return future.get(timeout=timeout_s)
    except Exception as exc:
        raise KafkaPublishError(f"{what} was not acknowledged: {type(exc).__name__}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# source


class KafkaSource:
    """Records from Kafka topics as :class:`RawRecord` (origin: topic, partition, offset, timestamp).

    ``commit()`` marks every record returned by ``poll()`` so far as processed and commits those
    offsets (manual commits only: a record counts as processed when the pipeline says so), at
    most every ``commit_interval_s``: a synchronous commit round trip per poll batch costs more
    than the batch's records, and a deferred commit only means that more records are consumed
    again after a crash (at-least-once), never that one is skipped. Marked offsets are always
    committed by :meth:`commit_now`, :meth:`pause`, :meth:`close`, before partitions are revoked,
    and on an idle poll once the interval has passed; while paused every ``commit()`` is
    immediate. ``commit_interval_s=0`` commits on every call. ``until_end=True``
    makes the source exhausted once it has caught up with the end offsets (batch jobs,
    benchmarks). :meth:`seek` overrides the committed offsets, e.g. from a reservoir checkpoint.

    A pipeline that keeps a polled batch in flight (decoding in a worker process while it polls
    the next) passes the :meth:`positions` after that batch to ``commit(positions)``, and sets
    ``before_revoke`` to a callable that finishes the batch in flight and returns the positions
    after it: the rebalance listener calls it (on kafka-python's IO thread, while ``poll()``
    waits; not during a keep-alive poll) before committing and giving partitions up, so a clean
    rebalance still hands over exactly the records processed. Offsets are only ever committed
    for partitions this member holds.
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topics: str | list[str],
        group_id: str = "stream-vips",
        group_instance_id: str | None = None,
        auto_offset_reset: str = "earliest",
        session_timeout_ms: int = 45_000,
        max_poll_interval_ms: int = 300_000,
        heartbeat_interval_ms: int = 3_000,
        long_update_s: float = 1.0,
        fetch_max_bytes: int = 52_428_800,
        max_partition_fetch_bytes: int = 1_048_576,
        until_end: bool = False,
        commit_timeout_s: float = 120.0,
        commit_interval_s: float = 1.0,
        client_id: str = "stream-vips-source",
        reconnect_backoff_max_ms: int = 1000,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        from kafka import KafkaConsumer

        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            raise KafkaConnectorError("topics is empty")
        if auto_offset_reset not in ("earliest", "latest"):
            raise KafkaConnectorError(f"auto_offset_reset must be earliest or latest, got {auto_offset_reset!r}")
        if long_update_s <= 0 or long_update_s * 1000 >= max_poll_interval_ms:
            raise KafkaConnectorError("long_update_s must be > 0 and below max_poll_interval_ms")
        if not commit_interval_s >= 0:
            raise KafkaConnectorError(f"commit_interval_s must be >= 0, got {commit_interval_s!r}")
        security = security_options({k: v for k, v in locals().items() if k in SECURITY_KEYS})
        self.group_id = group_id
        self.until_end = bool(until_end)
        self.commit_timeout_ms = int(commit_timeout_s * 1000)
        self.commit_interval_s = float(commit_interval_s)
        self.long_update_s = float(long_update_s)
        self._consumer = KafkaConsumer(
            bootstrap_servers=_servers(bootstrap_servers), group_id=group_id,
            group_instance_id=group_instance_id, client_id=client_id,
            enable_auto_commit=False, auto_offset_reset=auto_offset_reset,
            isolation_level="read_committed", session_timeout_ms=session_timeout_ms,
            max_poll_interval_ms=max_poll_interval_ms, heartbeat_interval_ms=heartbeat_interval_ms,
            fetch_max_bytes=fetch_max_bytes, max_partition_fetch_bytes=max_partition_fetch_bytes,
            reconnect_backoff_max_ms=reconnect_backoff_max_ms, **security,
        )
        self._lock = threading.RLock()
        self._next: dict[Any, int] = {}  # TopicPartition -> offset after the last returned record
        self._seek: dict[Any, int] = {}  # applied once, at the partition's next assignment
        self.duplicates_dropped = 0
        self._done: dict[Any, int] = {}  # offsets marked processed by commit()
        self._committed: dict[Any, int] = {}  # offsets the broker acknowledged
        self._last_commit = float("-inf")
        self._halted = False  # pause() until resume()
        self._long_paused = False  # paused by the keep-alive thread during a long update
        self._last_poll = time.monotonic()
        self._caught_up = False
        self._closed = threading.Event()
        self.before_revoke: Callable[[], Mapping[tuple[str, int], int] | None] | None = None
        self._polling_thread: int | None = None  # set while poll() (not the keep-alive) is in the consumer's poll
        self._consumer.subscribe(self.topics, listener=_SeekListener(self))
        self._keepalive = threading.Thread(target=self._keepalive_loop, name="kafka-source-keepalive", daemon=True)
        self._keepalive.start()

    # -- the Source protocol -------------------------------------------------------------------

    def poll(self, max_records: int, timeout_s: float) -> Sequence[RawRecord]:
        with self._lock:
            if self._long_paused and not self._halted:
                self._consumer.resume(*self._consumer.assignment())
            self._long_paused = False
            self._polling_thread = threading.get_ident()
            try:
                batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
            finally:
                self._polling_thread = None
            if self._halted:  # pause() from a rebalance callback during this poll
                self._consumer.pause(*self._consumer.assignment())
            segments = []
            for tp, recs in batches.items():
                floor = self._next.get(tp)
                if recs and floor is not None and recs[0].offset < floor:
                    recs = self._above_floor(tp, recs, floor)
                if recs:
                    segments.append((recs, partial(_origin, tp.topic, tp.partition)))
                    self._next[tp] = recs[-1].offset + 1
            out = RecordBatch(segments, _VALUE)
            if not out:
                if self._due():
                    self._flush()  # idle: do not leave processed records uncommitted
                if self.until_end:
                    self._caught_up = self._at_end()
            self._last_poll = time.monotonic()
            return out if out else []

    def _above_floor(self, tp: Any, recs: list, floor: int) -> list:
        """Drop records this process already returned (a partition given back after a rebalance,
        an eviction or a failed commit resumes at the last commit, which can be behind): a record
        must never reach the reservoir twice."""
        cut = next((i for i, r in enumerate(recs) if r.offset >= floor), len(recs))
        self.duplicates_dropped += cut
        log.warning("%s/%d: dropped %d records at offsets %d..%d already returned in this process",
                    tp.topic, tp.partition, cut, recs[0].offset, recs[cut - 1].offset)
        return recs[cut:]

    def commit(self, positions: Mapping[tuple[str, int], int] | None = None) -> None:
        """Mark every record returned so far (or those before ``positions``, from
        :meth:`positions`) as processed; commit the offsets after them if ``commit_interval_s``
        has passed since the last commit (or the source is paused)."""
        with self._lock:
            self._mark(positions)
            if self._halted or self._due():
                self._flush()
            self._last_poll = time.monotonic()

    def commit_now(self, positions: Mapping[tuple[str, int], int] | None = None) -> None:
        """Like :meth:`commit` but commit now (e.g. right after a checkpoint that reflects these
        offsets)."""
        with self._lock:
            self._mark(positions)
            self._flush()
            self._last_poll = time.monotonic()

    def _mark(self, positions: Mapping[tuple[str, int], int] | None) -> None:
        if positions is None:
            self._done.update(self._next)
            return
        from kafka.structs import TopicPartition

        self._done.update({TopicPartition(t, p): off for (t, p), off in positions.items()})

    def _due(self) -> bool:
        return time.monotonic() - self._last_commit >= self.commit_interval_s

    def _pending(self) -> dict[Any, Any]:
        """Marked offsets of held partitions that the broker does not have yet, as commit offsets."""
        from kafka.structs import OffsetAndMetadata

        held = self._consumer.assignment()
        return {tp: OffsetAndMetadata(off, "", -1) for tp, off in self._done.items()
                if tp in held and self._committed.get(tp) != off}

    def _flush(self) -> None:
        """Synchronously commit the marked offsets the broker does not have yet (caller holds the lock).

        Retriable failures (a broker restarting) are retried for ``commit_timeout_s``. A commit
        refused because the group rebalanced is logged, not raised: the partition's new owner
        resumes from the last committed offset (at-least-once).
        """
        from kafka.errors import CommitFailedError, KafkaError

        offsets = self._pending()
        if not offsets:
            return
        self._last_commit = time.monotonic()
        deadline = time.monotonic() + self.commit_timeout_ms / 1000
        while True:
            try:
                self._consumer.commit(offsets, timeout_ms=self.commit_timeout_ms)
            except CommitFailedError as exc:
                log.warning("offset commit refused after a rebalance: %s", exc)
                return
            except KafkaError as exc:
                if not _retriable(exc) or time.monotonic() >= deadline:
                    raise
                log.warning("offset commit failed (%s); retrying", exc)
                time.sleep(0.5)
                continue
            self._committed.update({tp: meta.offset for tp, meta in offsets.items()})
            return

    def pause(self) -> None:
        from kafka.errors import KafkaError

        if self._polling_thread not in (None, threading.get_ident()):
            self._halted = True  # from a rebalance callback while poll() holds the lock: poll() pauses
            return
        with self._lock:
            self._halted = True
            self._consumer.pause(*self._consumer.assignment())
            try:
                self._flush()
            except KafkaError as exc:  # the marked offsets stay pending for the next commit or close
                log.warning("offset commit on pause failed: %s", exc)

    def resume(self) -> None:
        with self._lock:
            self._halted = False
            self._long_paused = False
            self._consumer.resume(*self._consumer.assignment())

    @property
    def exhausted(self) -> bool:
        return self.until_end and self._caught_up

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            try:
                self._flush()
            finally:
                self._consumer.close(autocommit=False)
        self._keepalive.join(timeout=5)

    # -- offsets -------------------------------------------------------------------------------

    def positions(self) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` after every record returned so far."""
        with self._lock:
            return {(tp.topic, tp.partition): off for tp, off in self._next.items()}

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Start these partitions at these offsets (a checkpoint's) now or at their next
        assignment, once: a later assignment resumes at the committed offset, and records below
        what this process already returned are dropped (:meth:`_above_floor`)."""
        from kafka.structs import TopicPartition

        with self._lock:
            self._seek = {TopicPartition(t, p): int(o) for (t, p), o in offsets.items()}
            self._next.update(self._seek)
            for tp in self._consumer.assignment():
                if tp in self._seek:
                    self._consumer.seek(tp, self._seek.pop(tp))

    def lag(self) -> dict[tuple[str, int], int]:
        """Records behind the end of each assigned partition, from the high watermarks of the last
        fetch responses (no extra request; partitions not fetched yet are left out). For the
        ``consumer_lag_records`` gauge."""
        with self._lock:
            out = {}
            for tp in self._consumer.assignment():
                high = self._consumer.highwater(tp)
                if high is not None:
                    out[(tp.topic, tp.partition)] = max(0, high - self._next.get(tp, 0))
            return out

    def paused_partitions(self) -> set[tuple[str, int]]:
        with self._lock:
            return {(tp.topic, tp.partition) for tp in self._consumer.paused()}

    def _at_end(self) -> bool:
        from kafka.errors import KafkaError

        assigned = self._consumer.assignment()
        if not assigned:
            return False
        try:
            ends = self._consumer.end_offsets(list(assigned))
        except KafkaError:  # broker unreachable right now: not known to be at the end
            return False
        return all(self._consumer.position(tp) >= ends[tp] for tp in assigned)

    def _keepalive_loop(self) -> None:
        while not self._closed.wait(self.long_update_s / 2):
            if time.monotonic() - self._last_poll < self.long_update_s:
                continue
            if not self._lock.acquire(blocking=False):
                continue  # the pipeline is polling or committing right now
            try:
                if self._closed.is_set():
                    return
                if not self._long_paused:
                    self._consumer.pause(*self._consumer.assignment())
                    self._long_paused = True
                self._consumer.poll(timeout_ms=0)  # paused: fetches nothing, keeps the member alive
            except Exception as exc:  # the pipeline's next poll() reports real failures
                log.debug("keep-alive poll failed: %s", exc)
            finally:
                self._lock.release()


_VALUE = attrgetter("value")


def _origin(topic: str, partition: int, record: Any) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "offset": record.offset, "timestamp": record.timestamp}


def _listener_base() -> type:
    from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener

    return AsyncConsumerRebalanceListener


class _SeekListener(_listener_base()):
    """Commits processed offsets before partitions are revoked; applies :meth:`KafkaSource.seek`
    offsets when partitions are assigned; keeps pauses.

    kafka-python 3 runs rebalance listeners on the consumer's IO thread, where the blocking
    ``commit()`` refuses to run (it would wait on that same thread), so the listener is the async
    kind and awaits the coordinator's commit coroutine (a private kafka-python 3.0 API: the only
    way to commit synchronously inside a revocation). The pipeline's thread is blocked in
    ``poll()`` meanwhile, holding the source's lock, so nothing here takes that lock.
    """

    def __init__(self, source: KafkaSource) -> None:
        self.source = source

    async def on_partitions_revoked(self, revoked: Iterable[Any]) -> None:
        from kafka.errors import CommitFailedError, KafkaError

        src = self.source
        revoked = set(revoked)
        if not revoked:
            return  # a first join revokes nothing: there is nothing to finish or commit
        if src.before_revoke is not None and src._polling_thread is not None:
            positions = src.before_revoke()  # the pipeline finishes its batch in flight
            if positions:
                src._mark(positions)
        offsets = src._pending()
        if not offsets:
            return
        try:  # the next owner starts after what this member processed, not after its last commit
            await src._consumer._coordinator._commit_offsets_sync_async(offsets, timeout_ms=src.commit_timeout_ms)
        except (CommitFailedError, KafkaError) as exc:
            log.warning("offset commit before revocation failed (records may be consumed twice): %s", exc)
            return
        src._committed.update({tp: meta.offset for tp, meta in offsets.items()})
        src._last_commit = time.monotonic()

    async def on_partitions_lost(self, lost: Iterable[Any]) -> None:
        """Evicted from the group (no poll or heartbeat in time): the partitions already have new
        owners, which resume from the last commit, so there is nothing left to commit here."""
        log.warning("partitions lost to an eviction (records since the last commit are consumed again): %s",
                    sorted(f"{tp.topic}/{tp.partition}" for tp in lost))

    async def on_partitions_assigned(self, assigned: Iterable[Any]) -> None:
        src = self.source
        for tp in assigned:
            if tp in src._seek:  # a checkpoint's position applies once
                src._consumer.seek(tp, src._seek.pop(tp))
        if src._halted:
            src._consumer.pause(*assigned)


# ---------------------------------------------------------------------------------------------
# model sink


def _partition_for(key: bytes, partitions: int) -> int:
    from kafka.partitioner.default import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions


def chunk_payload(payload: bytes, max_bytes: int) -> list[bytes]:
    """Split ``payload`` into pieces of at most ``max_bytes`` (one piece when it fits)."""
    if max_bytes <= 0:
        raise ValueError("max_bytes must be positive")
    return [payload[i:i + max_bytes] for i in range(0, max(len(payload), 1), max_bytes)]


class KafkaModelSink:
    """Publishes model messages to a compacted topic keyed by model id.

    The topic is created (or checked) with ``cleanup.policy=compact`` and ``max_message_bytes``.
    A payload is chunked when its size would exceed ``max_message_bytes`` minus a framing
    reserve; the chunks go out in one transaction with headers ``stream-vips-chunk: i/n``,
    ``stream-vips-message-id`` and ``stream-vips-sha256``. Earlier chunks are keyed
    ``<model id>#chunk-<i>`` and the last one carries the model id key, so compaction keeps the
    latest complete message per model id and a plain reader of the key sees where it ends.
    A transient failure (a broker restarting) is retried, as a new transaction, for
    ``publish_timeout_s``; after that, or on a permanent error, :class:`KafkaPublishError`.
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = "stream-vips-models",
        create_topic: bool = True,
        partitions: int = 1,
        replication_factor: int = 1,
        max_message_bytes: int = 1_048_576,
        compression: str = "zstd",
        transactional_id: str | None = None,
        send_timeout_s: float = 30.0,
        publish_timeout_s: float = 120.0,
        client_id: str = "stream-vips-model-sink",
        reconnect_backoff_max_ms: int = 1000,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        from kafka import KafkaProducer

        if compression not in ("zstd", "lz4", "gzip", "snappy", "none"):
            raise KafkaConnectorError(f"compression must be zstd, lz4, gzip, snappy or none, got {compression!r}")
        if max_message_bytes <= 2 * RECORD_OVERHEAD:
            raise KafkaConnectorError(f"max_message_bytes must exceed {2 * RECORD_OVERHEAD}")
        security = security_options({k: v for k, v in locals().items() if k in SECURITY_KEYS})
        self.topic = topic
        self.max_message_bytes = int(max_message_bytes)
        self.chunk_bytes = self.max_message_bytes - RECORD_OVERHEAD
        self.send_timeout_s = float(send_timeout_s)
        self.publish_timeout_s = float(publish_timeout_s)
        ensure_topic(bootstrap_servers, topic, partitions=partitions, replication_factor=replication_factor,
                     configs={"cleanup.policy": "compact", "max.message.bytes": str(self.max_message_bytes)},
                     create=create_topic, security=security)
        self._producer_options = dict(
            bootstrap_servers=_servers(bootstrap_servers), client_id=client_id, acks="all",
            enable_idempotence=True, transactional_id=transactional_id or f"stream-vips-models-{uuid.uuid4().hex}",
            compression_type=None if compression == "none" else compression,
            max_request_size=self.max_message_bytes, linger_ms=0,
            reconnect_backoff_max_ms=reconnect_backoff_max_ms, **security,
        )
        self._security = security
        self._producer = KafkaProducer(**self._producer_options)
        self._producer.init_transactions()
        self._partitions = len(self._producer.partitions_for(topic) or []) or partitions
        self.chunked_messages = 0

    def publish(self, key: str, message: Mapping[str, Any]) -> None:
        payload = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
        key_b = key.encode("utf-8")
        partition = _partition_for(key_b, self._partitions)
        pieces = chunk_payload(payload, self.chunk_bytes)
        headers: list[tuple[str, bytes]] = []
        if len(pieces) > 1:
            self.chunked_messages += 1
            headers = [(MESSAGE_ID_HEADER, uuid.uuid4().hex.encode()),
                       (SHA256_HEADER, hashlib.sha256(payload).hexdigest().encode())]
        records = []
        for i, piece in enumerate(pieces):
            h = headers + [(CHUNK_HEADER, f"{i}/{len(pieces)}".encode())] if headers else []
            k = key_b if i == len(pieces) - 1 else key_b + f"#chunk-{i}".encode()
            records.append((k, piece, h))
        what = f"model {key!r} version {message.get('version')}"
        deadline = time.monotonic() + self.publish_timeout_s
        while True:
            try:
                self._send_transaction(records, partition, what)
                return
            except KafkaPublishError as exc:
                if not _retriable(exc) or time.monotonic() >= deadline:
                    raise
                log.warning("%s: %s; retrying", what, exc)
                time.sleep(0.5)

    def _send_transaction(self, records: list[tuple[bytes, bytes, list]], partition: int, what: str) -> None:
        """All records of one message in one transaction; aborted (or the producer replaced,
        which fences and aborts) on failure."""
        from kafka import KafkaProducer

        try:
            self._producer.begin_transaction()
            futures = [self._producer.send(self.topic, value=v, key=k, headers=h, partition=partition)
                       for k, v, h in records]
            self._producer.flush(timeout=self.send_timeout_s)
            for i, f in enumerate(futures):
                _check_future(f, self.send_timeout_s, f"{what} part {i + 1}/{len(futures)}")
            self._producer.commit_transaction()
        except Exception as exc:
            try:
                self._producer.abort_transaction()
            except Exception as abort_exc:
                log.warning("aborting the model transaction failed (%s): starting a new producer", abort_exc)
                self._producer.close(timeout=0)
                self._producer = KafkaProducer(**self._producer_options)
                self._producer.init_transactions()
            if isinstance(exc, KafkaPublishError):
                raise
            raise KafkaPublishError(f"{what} was not published: {type(exc).__name__}: {exc}") from exc

    def flush(self) -> None:
        self._producer.flush(timeout=self.send_timeout_s)

    def latest(self, key: str) -> dict[str, Any] | None:
        """The last committed message for ``key`` on the topic (reassembled), or ``None``."""
        found = None
        assembler = Reassembler()
        for rec in read_topic(self._producer_options["bootstrap_servers"], self.topic, security=self._security,
                              timeout_s=self.publish_timeout_s):
            whole = assembler.add(rec.key, rec.value, rec.headers)
            if whole is not None and whole[0] == key:
                found = whole[1]
        return None if found is None else json.loads(found)

    def close(self) -> None:
        self._producer.close(timeout=self.send_timeout_s)


def chunk_info(headers: Sequence[tuple[str, bytes]] | None) -> tuple[int, int, str, str] | None:
    """``(index, count, message_id, sha256)`` of a chunk record, ``None`` for a whole message."""
    h = dict(headers or [])
    if CHUNK_HEADER not in h:
        return None
    index, _, count = h[CHUNK_HEADER].decode().partition("/")
    return int(index), int(count), h[MESSAGE_ID_HEADER].decode(), h[SHA256_HEADER].decode()


class Reassembler:
    """Turns model-topic records (in partition order) back into whole payloads.

    ``add(key, value, headers)`` returns ``(model_id, payload)`` when a message is complete and
    ``None`` for a non-final chunk. A final chunk whose pieces are missing or whose checksum
    fails raises :class:`KafkaConnectorError`.
    """

    def __init__(self) -> None:
        self._parts: dict[str, dict[int, bytes]] = {}

    def add(self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None) -> tuple[str, bytes] | None:
        info = chunk_info(headers)
        key_s = (key or b"").decode("utf-8")
        if info is None:
            return (key_s, value) if value is not None else None
        index, count, message_id, digest = info
        parts = self._parts.setdefault(message_id, {})
        parts[index] = value or b""
        if index != count - 1:
            return None
        del self._parts[message_id]
        if len(parts) != count:
            raise KafkaConnectorError(f"model {key_s!r}: {count - len(parts)} of {count} chunks missing")
        payload = b"".join(parts[i] for i in range(count))
        if hashlib.sha256(payload).hexdigest() != digest:
            raise KafkaConnectorError(f"model {key_s!r}: reassembled payload fails its sha256")
        return key_s, payload


# ---------------------------------------------------------------------------------------------
# dead letters


class KafkaDeadLetterSink:
    """Rejected records on a dead-letter topic.

    Value: the original bytes, or their first ``runtime.dead_letter_max_bytes`` (the pipeline
    bounds every letter, so a send never fails for size). Key: ``<topic>/<partition>/<offset>``
    of the source record when known. Headers: ``reason``, ``detail``, ``length`` and ``sha256``
    of the original value, ``truncated``, ``source.topic``, ``source.partition``,
    ``source.offset`` (and any other origin field as ``source.<name>``). Sends are asynchronous;
    :meth:`flush` confirms them all, and the pipeline calls it before committing any offset.
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = "stream-vips-dead-letters",
        create_topic: bool = True,
        partitions: int = 1,
        replication_factor: int = 1,
        send_timeout_s: float = 30.0,
        client_id: str = "stream-vips-dead-letters",
        reconnect_backoff_max_ms: int = 1000,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        from kafka import KafkaProducer

        security = security_options({k: v for k, v in locals().items() if k in SECURITY_KEYS})
        self.topic = topic
        self.send_timeout_s = float(send_timeout_s)
        ensure_topic(bootstrap_servers, topic, partitions=partitions, replication_factor=replication_factor,
                     create=create_topic, security=security)
        self._producer = KafkaProducer(bootstrap_servers=_servers(bootstrap_servers), client_id=client_id,
                                       acks="all", enable_idempotence=True, compression_type="zstd",
                                       linger_ms=5, reconnect_backoff_max_ms=reconnect_backoff_max_ms, **security)
        self._pending: list[Any] = []

    def send(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            origin = dict(letter.record.origin)
            headers = [("reason", letter.reason.encode()), ("detail", letter.detail.encode("utf-8", "replace"))]
            if letter.length is not None:
                headers += [("length", str(letter.length).encode()), ("sha256", str(letter.sha256).encode()),
                            ("truncated", b"true" if letter.truncated else b"false")]
            headers += [(f"source.{k}", str(v).encode()) for k, v in origin.items()]
            key = None
            if {"topic", "partition", "offset"} <= set(origin):
                key = f"{origin['topic']}/{origin['partition']}/{origin['offset']}".encode()
            self._pending.append(self._producer.send(self.topic, value=letter.record.value, key=key, headers=headers))
        if len(self._pending) > 10_000:
            self.flush()

    def flush(self) -> None:
        """Wait for every letter sent so far; :class:`KafkaPublishError` if one was refused (the
        pipeline then stops without committing the source past it)."""
        if not self._pending:
            return
        self._producer.flush(timeout=self.send_timeout_s)
        pending, self._pending = self._pending, []
        for f in pending:
            _check_future(f, self.send_timeout_s, f"dead letter to {self.topic!r}")

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._producer.close(timeout=self.send_timeout_s)


def dead_letter_from_record(record: Any) -> dict[str, Any]:
    """Decode a dead-letter topic record: value bytes, reason, detail and source fields."""
    h = {k: v.decode("utf-8", "replace") for k, v in (record.headers or [])}
    source = {k[len("source."):]: v for k, v in h.items() if k.startswith("source.")}
    out = {"value": record.value, "reason": h.get("reason"), "detail": h.get("detail"), "source": source}
    if "length" in h:
        out.update(length=int(h["length"]), sha256=h.get("sha256"), truncated=h.get("truncated") == "true")
    return out


# ---------------------------------------------------------------------------------------------
# ledger


def read_topic(bootstrap_servers: str | list[str], topic: str, *, security: Mapping[str, Any] | None = None,
               timeout_s: float = 30.0, settle_s: float = 5.0) -> list[Any]:
    """Every committed record of ``topic`` from the beginning to the current end, per partition
    in offset order (partitions one after another).

    A transaction's commit markers reach a partition shortly after the producer's commit
    returns; until then the committed end stops before it. So once the committed end is reached,
    reading goes on (for at most ``settle_s``) until it reaches the partitions' high watermarks,
    which a transaction that is still open, not just committed, keeps it from doing."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=_servers(bootstrap_servers), group_id=None,
                             enable_auto_commit=False, isolation_level="read_committed", **dict(security or {}))
    try:
        parts = consumer.partitions_for_topic(topic)
        if parts is None:
            raise KafkaConnectorError(f"topic {topic!r} does not exist")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: dict[Any, list] = {tp: [] for tp in tps}
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise KafkaConnectorError(f"reading topic {topic!r} to its end took over {timeout_s}s")
            for tp, recs in consumer.poll(timeout_ms=500).items():
                out[tp].extend(recs)
        settled = time.monotonic() + settle_s
        while time.monotonic() < settled and any(
                consumer.position(tp) < (consumer.highwater(tp) or 0) for tp in tps):
            for tp, recs in consumer.poll(timeout_ms=100).items():
                out[tp].extend(recs)
        return [r for tp in tps for r in out[tp]]
    finally:
        consumer.close(autocommit=False)


class KafkaLedger(LedgerSteps):
    """The privacy ledger on a compacted Kafka topic (the Ledger protocol).

    Each event is the same checksummed line as :class:`~stream_vips.privacy.ledger.FileLedger`
    writes, keyed ``<name>/<step, 12 digits>`` so compaction never merges two steps; the genesis
    line (the ledger's random id) is keyed ``<name>/genesis`` and written when the name has no
    records yet. Every append is its own transaction of the producer whose ``transactional.id``
    is derived from the name; ``append`` returns only after the commit is acknowledged
    (``acks=all``), so the event is durable before any noise is drawn or any model message is
    sent. Opening the ledger initialises that transactional id, which fences an older process
    still holding it (its next append fails) and aborts whatever it left open, then replays the
    committed events; steps must run 0, 1, ... without a gap, else :class:`LedgerCorrupt`.

    **Durability.** The topic is created with ``replication_factor`` (default 3) and
    ``min.insync.replicas`` = ``min_insync_replicas`` (default 2), and an existing topic with
    weaker settings is refused: with one replica, a lost broker disk resets the budget. Only
    ``allow_weak_durability: true`` (single-broker tests and development) accepts less. ``name``
    was called ``ledger_id`` before ledgers had a genesis id; both spellings are accepted.
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        topic: str = "stream-vips-ledger",
        name: str | None = None,
        ledger_id: str | None = None,
        create_topic: bool = True,
        replication_factor: int = 3,
        min_insync_replicas: int = 2,
        allow_weak_durability: bool = False,
        supersedes: Sequence[str] = (),
        send_timeout_s: float = 30.0,
        append_timeout_s: float = 120.0,
        reconnect_backoff_max_ms: int = 1000,
        security_protocol: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
    ) -> None:
        from kafka import KafkaProducer

        security = security_options({k: v for k, v in locals().items() if k in SECURITY_KEYS})
        name = name or ledger_id or "default"
        if "/" in name:
            raise KafkaConnectorError(f"ledger name must not contain '/', got {name!r}")
        if not allow_weak_durability and (replication_factor < 3 or min_insync_replicas < 2):
            raise KafkaConnectorError(
                f"ledger topic {topic!r}: replication_factor {replication_factor} / min_insync_replicas "
                f"{min_insync_replicas} is weaker than 3 / 2; a lost broker would reset the budget "
                "(allow_weak_durability: true accepts it for tests and development)")
        self.append_timeout_s = float(append_timeout_s)
        self.topic = topic
        self.name = name
        self.send_timeout_s = float(send_timeout_s)
        self._servers = _servers(bootstrap_servers)
        self._security = security
        ensure_topic(self._servers, topic, partitions=1, replication_factor=replication_factor,
                     configs={"cleanup.policy": "compact", "min.insync.replicas": str(min_insync_replicas)},
                     create=create_topic, security=security,
                     min_replication=1 if allow_weak_durability else 3)
        self._producer = KafkaProducer(
            bootstrap_servers=self._servers, client_id=f"stream-vips-ledger-{name}", acks="all",
            enable_idempotence=True, transactional_id=f"stream-vips-ledger-{name}", linger_ms=0,
            reconnect_backoff_max_ms=reconnect_backoff_max_ms, **security)
        self._producer.init_transactions()  # fences an older writer and aborts its open transaction
        self._failed: Exception | None = None
        genesis, self._events, self._positions = self._replay()
        if genesis is None:
            genesis = new_genesis(supersedes)
            self._commit([(f"{name}/genesis".encode(), encode_genesis(genesis).rstrip(b"\n"))], "ledger genesis")
            log.info("ledger %s/%s created with id %s", topic, name, genesis["ledger_id"])
        elif supersedes:
            raise LedgerCorrupt(f"ledger {topic!r}/{name!r} already has records; a reset needs a new ledger name")
        self._genesis = genesis

    def _replay(self) -> tuple[dict | None, list, list]:
        prefix = f"{self.name}/".encode()
        genesis_key = prefix + b"genesis"
        genesis_line, lines = None, []
        for rec in read_topic(self._servers, self.topic, security=self._security, timeout_s=self.send_timeout_s):
            if rec.key == genesis_key:
                genesis_line = rec.value
            elif rec.key is not None and rec.key.startswith(prefix):
                lines.append(rec.value)
        if genesis_line is None and not lines:
            return None, [], []
        where = f"ledger topic {self.topic!r} name {self.name!r}"
        if genesis_line is not None:
            lines.insert(0, genesis_line)
        genesis, events, positions = replay_lines(lines, where)
        if genesis_line is None:
            log.warning("%s has no genesis (written by an older version): its id is %s", where, genesis["ledger_id"])
        return genesis, events, positions

    def append_many(self, entries: Sequence[tuple[Any, int | None]]) -> int:
        """Commit ``(event, position)`` entries as the next steps, all in one transaction (a
        ``read_committed`` replay sees all or none); transient failures are retried for
        ``append_timeout_s``. Returns the first step.

        A retry reuses the step numbers only after the failed transaction was aborted. When the
        outcome is unknown (the abort fails, e.g. the commit itself was interrupted) the ledger
        refuses further appends: a restart replays what was committed, so a step number is never
        used twice.
        """
        first = len(self._events)
        records = [(f"{self.name}/{first + i:012d}".encode(), encode_line(first + i, e, p).rstrip(b"\n"))
                   for i, (e, p) in enumerate(entries)]
        what = f"ledger events for steps {first}..{first + len(records) - 1}"
        self._commit(records, what)
        return self._record(entries)

    def _commit(self, records: Sequence[tuple[bytes, bytes]], what: str) -> None:
        if self._failed is not None:
            raise KafkaPublishError(
                f"ledger {self.name!r} refused further appends after a failed one ({self._failed}); "
                "restart to replay what was committed")
        deadline = time.monotonic() + self.append_timeout_s
        while True:
            try:
                self._producer.begin_transaction()
                futures = [self._producer.send(self.topic, value=v, key=k, partition=0) for k, v in records]
                self._producer.flush(timeout=self.send_timeout_s)
                for future in futures:
                    _check_future(future, self.send_timeout_s, what)
                self._producer.commit_transaction()
                return
            except Exception as exc:
                error = exc if isinstance(exc, KafkaPublishError) else KafkaPublishError(
                    f"{what} was not committed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc.__cause__ if isinstance(exc, KafkaPublishError) else exc
                try:
                    self._producer.abort_transaction()
                except Exception as abort_exc:
                    log.error("aborting the ledger transaction failed (%s): outcome of %s unknown", abort_exc, what)
                    self._failed = error
                    raise error from exc
                if not _retriable(error) or time.monotonic() >= deadline:
                    raise error from exc
                log.warning("%s; retrying", error)
                time.sleep(0.5)

    def close(self) -> None:
        self._producer.close(timeout=self.send_timeout_s)
