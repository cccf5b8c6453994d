"""Kafka record source: :class:`KafkaSource`, a consumer-group member with manual offset commits
and bounded polls, and the rebalance hooks through which its client library commits before
partitions are revoked (:class:`~connectors.kafka.rebalance.Rebalance`).

While an update runs long (no ``poll()`` for ``long_update_s``) a keep-alive thread pauses the
assigned partitions and keeps polling, so the member is not evicted for exceeding
``max.poll.interval.ms``; the next ``poll()`` resumes them. ``pause()`` (budget halted) pauses
everything for good while polling keeps the membership alive. ``group_instance_id`` turns on
static membership (a restart within the session timeout causes no rebalance).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from connectors.kafka.access import Grant, check_access
from connectors.kafka.clients import consumer_client
from connectors.kafka.connection import KafkaConnection, log, takes_connection
from connectors.kafka.errors import CommitRefused, KafkaConnectorError, retriable
from connectors.kafka.topics import BROKER_DEFAULT, TopicSpec, connection_of
from stream_vips.io import Coverage, RawRecord, RecordBatch


class KafkaSource:
    """Records from Kafka topics as :class:`RawRecord` (origin: topic, partition, offset, timestamp, key).

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
    after it: the rebalance hooks call it (:meth:`revoking`; on kafka-python's IO thread while
    ``poll()`` waits, with confluent-kafka inside ``poll()`` on the calling thread; not during a
    keep-alive poll) before committing and giving partitions up, so a clean rebalance still hands
    over exactly the records processed. Offsets are only ever committed for partitions this
    member holds. The same rules run on either client library (``client``,
    :mod:`connectors.kafka.clients`).

    Connection settings come flat (``bootstrap_servers``, security, ``reconnect_backoff_max_ms``,
    ``client``) or as one ``connection`` (:func:`~connectors.kafka.connection.takes_connection`); the client
    id defaults to ``<prefix>-source``.
    """

    @takes_connection
    def __init__(
        self,
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
        client_id: str | None = None,
        partitions: list[int] | None = None,
        expected_partitions: int | None = None,
        *,
        connection: KafkaConnection,
    ) -> None:
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if partitions is not None and (not partitions or min(partitions) < 0):
            raise KafkaConnectorError(f"partitions must be a non-empty list of partition numbers, got {partitions!r}")
        self.partitions = None if partitions is None else sorted(set(partitions))
        self.expected_partitions = expected_partitions
        if not self.topics:
            raise KafkaConnectorError("topics is empty")
        if auto_offset_reset not in ("earliest", "latest"):
            raise KafkaConnectorError(f"auto_offset_reset must be earliest or latest, got {auto_offset_reset!r}")
        if long_update_s <= 0 or long_update_s * 1000 >= max_poll_interval_ms:
            raise KafkaConnectorError("long_update_s must be > 0 and below max_poll_interval_ms")
        if not commit_interval_s >= 0:
            raise KafkaConnectorError(f"commit_interval_s must be >= 0, got {commit_interval_s!r}")
        self.group_id = group_id
        check_access(connection.servers, connection.security, self.grants(self.topics, group_id))
        self.until_end = bool(until_end)
        self.commit_timeout_ms = int(commit_timeout_s * 1000)
        self.commit_interval_s = float(commit_interval_s)
        self.long_update_s = float(long_update_s)
        self._client = consumer_client(connection, client_id or connection.client_id("source"), dict(
            group_id=group_id, group_instance_id=group_instance_id, enable_auto_commit=False,
            auto_offset_reset=auto_offset_reset, isolation_level="read_committed",
            session_timeout_ms=session_timeout_ms, max_poll_interval_ms=max_poll_interval_ms,
            heartbeat_interval_ms=heartbeat_interval_ms, fetch_max_bytes=fetch_max_bytes,
            max_partition_fetch_bytes=max_partition_fetch_bytes))
        self._consumer = self._client.raw  # the library's own consumer (tests and audits reach it)
        self._offset_of = self._client.offset_of
        self._lock = threading.RLock()
        self._next: dict[Any, int] = {}  # (topic, partition) -> offset after the last returned record
        self._seek: dict[Any, int] = {}  # applied once, at the partition's next assignment
        self.duplicates_dropped = 0
        self.unexpected_dropped = 0  # records of topics this source does not read (never returned)
        self._held_nothing = False  # the last coverage check found no partition held
        self._warned_topics: set[str] = set()
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
        if self.partitions is None:
            self._client.subscribe(self.topics, self)
        else:
            self._check_partition_count()
            self._client.assign([(t, p) for t in self.topics for p in self.partitions], self)
        self._keepalive = threading.Thread(target=self._keepalive_loop, name="kafka-source-keepalive", daemon=True)
        self._keepalive.start()

    @staticmethod
    def topic_specs(topics: str | list[str], partitions: int) -> list[TopicSpec]:
        """The input topics: nothing required of their settings (they are the producers'; the
        source only reads them), so they are created with ``partitions`` (the creator's choice)
        and the broker's default replication."""
        return [TopicSpec(t, "input", partitions, BROKER_DEFAULT,
                          risk="a lost broker disk loses the records not yet read")
                for t in ([topics] if isinstance(topics, str) else topics)]

    @staticmethod
    def partition_counts(topics: str | list[str], **options: Any) -> dict[str, int]:
        """The partition count of each input topic (one metadata request), for a source
        configured with ``options``: the sharded runtime lays the partitions out over its shards."""
        names = [topics] if isinstance(topics, str) else list(topics)
        connection = connection_of(options)
        client = consumer_client(connection, connection.client_id("source-metadata"),
                                 {"group_id": options.get("group_id", "stream-vips"), "enable_auto_commit": False})
        try:
            return client.partition_counts(names)
        finally:
            client.close()

    @staticmethod
    def grants(topics: str | list[str], group_id: str = "stream-vips") -> list[Grant]:
        """The ACLs the source needs (checked at start; :mod:`connectors.kafka.access`)."""
        names = [topics] if isinstance(topics, str) else list(topics)
        return [*(Grant("topic", t, "Read", "the source consumes the records",
                        "connectors.kafka.source.KafkaSource.poll")
                  for t in names),
                Grant("group", group_id, "Read", "the source joins its consumer group and commits offsets",
                      "connectors.kafka.source.KafkaSource.poll and .commit")]

    def _check_partition_count(self) -> None:
        """With assigned partitions, refuse topics whose partition count is not the one the
        partitions were laid out for (``expected_partitions``; by default, the count must cover
        them): a changed count moves keys between partitions, so a shard's records would change."""
        counts = self._client.partition_counts(self.topics)
        for topic, count in counts.items():
            expected = self.expected_partitions
            if (expected is not None and count != expected) or (self.partitions and count <= max(self.partitions)):
                self._client.close()
                raise KafkaConnectorError(
                    f"topic {topic!r} has {count} partitions, but this source was laid out for "
                    f"{expected if expected is not None else 'at least ' + str(max(self.partitions or [0]) + 1)}: "
                    "a changed partition count moves keys between partitions and shards; refused")

    # -- the Source protocol -------------------------------------------------------------------

    def poll(self, max_records: int, timeout_s: float) -> Sequence[RawRecord]:
        with self._lock:
            client, offset_of = self._client, self._offset_of
            if self._long_paused and not self._halted:
                client.resume(client.assignment())
            self._long_paused = False
            self._polling_thread = threading.get_ident()
            try:
                batches = client.fetch(max_records, timeout_s)
            finally:
                self._polling_thread = None
            if self._halted:  # pause() from a rebalance callback during this poll
                client.pause(client.assignment())
            segments = []
            for tp, recs in batches:
                if tp[0] not in self.topics:
                    self._unexpected(tp, len(recs))
                    continue
                floor = self._next.get(tp)
                if recs and floor is not None and offset_of(recs[0]) < floor:
                    recs = self._above_floor(tp, recs, floor)
                if recs:
                    segments.append((recs, client.origin(tp[0], tp[1])))
                    self._next[tp] = offset_of(recs[-1]) + 1
            out = RecordBatch(segments, client.value_of)
            if not out:
                if self._due():
                    self._flush()  # idle: do not leave processed records uncommitted
                if self.until_end:
                    self._caught_up = self._at_end()
            self._last_poll = time.monotonic()
            return out if out else []

    def _unexpected(self, tp: Any, n: int) -> None:
        """Records of a topic this source was not given are never returned (the client should
        not deliver them; if one does, they are no arrivals of this stream: the topic is public,
        so skipping them moves no reservoir decision). Counted and logged, once per topic."""
        self.unexpected_dropped += n
        if tp[0] not in self._warned_topics:
            self._warned_topics.add(tp[0])
            log.warning("skipped %d records of topic %r, which this source does not read", n, tp[0])

    def _above_floor(self, tp: Any, recs: list, floor: int) -> list:
        """Drop records this process already returned (a partition given back after a rebalance,
        an eviction or a failed commit resumes at the last commit, which can be behind): a record
        must never reach the reservoir twice."""
        offsets = list(map(self._offset_of, recs))
        cut = bisect_left(offsets, floor)
        self.duplicates_dropped += cut
        log.warning("%s/%d: dropped %d records at offsets %d..%d already returned in this process",
                    tp[0], tp[1], cut, offsets[0], offsets[cut - 1])
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
        self._done.update(self._next if positions is None else {(t, p): off for (t, p), off in positions.items()})

    def _due(self) -> bool:
        return time.monotonic() - self._last_commit >= self.commit_interval_s

    def _pending(self) -> dict[Any, int]:
        """Marked offsets of held partitions that the broker does not have yet."""
        held = self._client.assignment()
        return {tp: off for tp, off in self._done.items() if tp in held and self._committed.get(tp) != off}

    def _flush(self) -> None:
        """Synchronously commit the marked offsets the broker does not have yet (caller holds the lock).

        Retriable failures (a broker restarting) are retried for ``commit_timeout_s``. A commit
        refused because the group rebalanced is logged, not raised: the partition's new owner
        resumes from the last committed offset (at-least-once).
        """
        offsets = self._pending()
        if not offsets:
            return
        self._last_commit = time.monotonic()
        deadline = time.monotonic() + self.commit_timeout_ms / 1000
        while True:
            try:
                self._client.commit(offsets, self.commit_timeout_ms / 1000)
            except CommitRefused as exc:
                log.warning("offset commit refused after a rebalance: %s", exc)
                return
            except Exception as exc:
                if not retriable(exc) or time.monotonic() >= deadline:
                    raise
                log.warning("offset commit failed (%s); retrying", exc)
                time.sleep(0.5)
                continue
            self._committed.update(offsets)
            return

    def pause(self) -> None:
        if self._polling_thread not in (None, threading.get_ident()):
            self._halted = True  # from a rebalance callback while poll() holds the lock: poll() pauses
            return
        with self._lock:
            self._halted = True
            self._client.pause(self._client.assignment())
            try:
                self._flush()
            except Exception as exc:  # the marked offsets stay pending for the next commit or close
                log.warning("offset commit on pause failed: %s", exc)

    def resume(self) -> None:
        with self._lock:
            self._halted = False
            self._long_paused = False
            self._client.resume(self._client.assignment())

    @property
    def exhausted(self) -> bool:
        return self.until_end and self._caught_up

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            try:
                self._flush()
            finally:
                self._client.close()
        self._keepalive.join(timeout=5)

    # -- offsets -------------------------------------------------------------------------------

    def positions(self) -> dict[tuple[str, int], int]:
        """``{(topic, partition): next offset}`` after every record returned so far."""
        with self._lock:
            return {(tp[0], tp[1]): off for tp, off in self._next.items()}

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Start these partitions at these offsets (a checkpoint's) now or at their next
        assignment, once: a later assignment resumes at the committed offset, and records below
        what this process already returned are dropped (:meth:`_above_floor`)."""
        with self._lock:
            self._seek = {(t, p): int(o) for (t, p), o in offsets.items()}
            self._next.update(self._seek)
            for tp in self._client.assignment():
                if tp in self._seek:
                    self._client.seek(tp, self._seek.pop(tp))

    def lag(self) -> dict[tuple[str, int], int]:
        """Records behind the end of each assigned partition, from the high watermarks of the last
        fetch responses (no extra request; partitions not fetched yet are left out). For the
        ``consumer_lag_records`` gauge."""
        with self._lock:
            out = {}
            for tp in self._client.assignment():
                high = self._client.highwater(tp)
                if high is not None:
                    out[(tp[0], tp[1])] = max(0, high - self._next.get(tp, 0))
            return out

    def coverage(self) -> Coverage:
        """The partitions this member holds and the topics it was given that do not exist (a
        metadata request). A member that holds none of the partitions its topics have, at two
        checks in a row, asks the group to assign again (:meth:`ConsumerClient.rejoin`): a
        restarted static member otherwise keeps an empty assignment made while its topic was
        missing. The service is the group's only member, so holding nothing is never right."""
        with self._lock:
            counts = self._client.partition_counts(self.topics)
            held = len(self._client.assignment())
            cover = Coverage(held=held, partitions=sum(counts.values()), topics=tuple(self.topics),
                             missing=tuple(t for t, n in counts.items() if not n))
            if not held and cover.partitions and self._held_nothing and not self._halted:
                log.warning("holding none of the %d partitions of %s: asking the group to assign them again",
                            cover.partitions, ", ".join(self.topics))
                self._client.rejoin()
            self._held_nothing = not held and bool(cover.partitions)
            return cover

    def paused_partitions(self) -> set[tuple[str, int]]:
        with self._lock:
            return {(tp[0], tp[1]) for tp in self._client.paused()}

    def _at_end(self) -> bool:
        assigned = self._client.assignment()
        return bool(assigned) and self._client.at_end(assigned, self._next)

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
                    self._client.pause(self._client.assignment())
                    self._long_paused = True
                self._client.keepalive()  # paused: fetches nothing, keeps the member alive
            except Exception as exc:  # the pipeline's next poll() reports real failures
                log.debug("keep-alive poll failed: %s", exc)
            finally:
                self._lock.release()


    # -- rebalance hooks (the client calls them from inside its poll) ----------------------------

    @property
    def halted(self) -> bool:
        return self._halted

    def revoking(self, revoked: set[Any]) -> dict[Any, int]:
        """Before partitions are revoked: finish the batch in flight (``before_revoke``, only
        when the pipeline's own ``poll()`` is running, not a keep-alive) and return the offsets
        to commit, so the next owner starts after what this member processed, not after its
        last commit. The pipeline's thread is inside ``poll()`` holding the lock meanwhile
        (kafka-python calls this on its IO thread), so nothing here takes the lock."""
        if not revoked:
            return {}  # a first join revokes nothing: there is nothing to finish or commit
        if self.before_revoke is not None and self._polling_thread is not None:
            positions = self.before_revoke()  # the pipeline finishes its batch in flight
            if positions:
                self._mark(positions)
        return self._pending()

    def revoke_committed(self, offsets: Mapping[Any, int]) -> None:
        self._committed.update(offsets)
        self._last_commit = time.monotonic()

    def assigned(self, assigned: set[Any]) -> dict[Any, int]:
        """The checkpoint offsets to start newly assigned partitions at (each applies once)."""
        return {tp: self._seek.pop(tp) for tp in assigned if tp in self._seek}
