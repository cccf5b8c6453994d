"""Kafka privacy ledger: :class:`KafkaLedger` keeps privacy events on a compacted topic, one key
per step, written by a transactional producer and confirmed before ``append`` returns (privacy
rule 7 in docs/privacy.md). Opening it fences any older writer with the same ledger name and
replays the committed events."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.kafka.access import Grant, check_access, denial, discard_producer, grant_for
from connectors.kafka.admin import read_topic
from connectors.kafka.clients import producer_client
from connectors.kafka.connection import KafkaConnection, log, takes_connection
from connectors.kafka.errors import KafkaConnectorError, KafkaPublishError, retriable
from connectors.kafka.topics import TopicSpec, describe_cluster, too_few_brokers
from stream_vips.privacy.ledger import (
    LedgerCorrupt,
    LedgerSteps,
    encode_genesis,
    encode_line,
    new_genesis,
    replay_lines,
)

#: The ledger topic's durable minimum: replicas, and ``min.insync.replicas`` (one broker may be lost).
DURABLE_REPLICAS, DURABLE_INSYNC = 3, 2


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
    weaker settings is refused: with one replica, a lost broker disk makes the spent budget
    unrecoverable. Only ``allow_weak_durability: true`` (single-broker tests and development)
    accepts less: the topic then gets what the cluster can hold (at most one replica per broker,
    ``min.insync.replicas`` at most the replicas), and a WARNING says what is weakened. ``name``
    was called ``ledger_id`` before ledgers had a genesis id; both spellings are accepted.
    Connection settings come flat or as one ``connection``; the client id is
    ``<prefix>-ledger-<name>``, the transactional id always ``stream-vips-ledger-<name>`` (it is
    what fences an older writer).
    """

    #: Every ledger's transactional id is this prefix plus its name (a reset starts a new name).
    TRANSACTIONAL_PREFIX = "stream-vips-ledger-"

    @staticmethod
    def grants(topic: str = "stream-vips-ledger", create_topic: bool = True) -> list[Grant]:
        """The ACLs the ledger needs (checked at start; :mod:`connectors.kafka.access`)."""
        out = [Grant("topic", topic, "Read", "the Kafka ledger replays its events at start",
                     "connectors.kafka.ledger.read_ledger_topic"),
               Grant("topic", topic, "Write", "the Kafka ledger appends each step in a transaction",
                     "connectors.kafka.ledger.KafkaLedger.append_many"),
               Grant("topic", topic, "DescribeConfigs", "the Kafka ledger checks cleanup.policy, min.insync.replicas "
                     "and the replicas at start", "connectors.kafka.admin.ensure_topic"),
               Grant("transactionalId", KafkaLedger.TRANSACTIONAL_PREFIX, "Write",
                     "the Kafka ledger writes in transactions, one id per ledger name, and a reset starts a new name",
                     "connectors.kafka.ledger.KafkaLedger.__init__ and ._commit", pattern="prefix")]
        if create_topic:
            out.append(Grant("topic", topic, "Create", "the Kafka ledger creates the topic when it is missing "
                             "and create_topic is true", "connectors.kafka.admin.ensure_topic"))
        return out

    @takes_connection
    def __init__(
        self,
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
        *,
        connection: KafkaConnection,
    ) -> None:
        name = name or ledger_id or "default"
        if "/" in name:
            raise KafkaConnectorError(f"ledger name must not contain '/', got {name!r}")
        if not allow_weak_durability and (replication_factor < DURABLE_REPLICAS
                                          or min_insync_replicas < DURABLE_INSYNC):
            raise KafkaConnectorError(
                f"ledger topic {topic!r}: replication_factor {replication_factor} / min_insync_replicas "
                f"{min_insync_replicas} is weaker than 3 / 2; a lost broker disk would lose the record of the spent "
                "budget (allow_weak_durability: true accepts it for tests and development)")
        self.append_timeout_s = float(append_timeout_s)
        self.topic = topic
        self.name = name
        self.send_timeout_s = float(send_timeout_s)
        self._connection = connection
        self._grants = self.grants(topic, create_topic)
        spec = self.topic_spec(topic, replication_factor, min_insync_replicas, allow_weak_durability)
        if spec.fits_cluster:  # the cluster is asked first: a refused login must say so, not time out
            check_access(connection.servers, connection.security, self._grants)
            spec = self._weakened(spec)
        try:
            spec.ensure(connection.servers, connection.security, create_topic, self._grants)
        except KafkaConnectorError as exc:
            if too_few_brokers(exc):
                raise KafkaConnectorError(
                    f"{exc} (the cluster has fewer than {replication_factor} brokers). On one broker (development) set "
                    "allow_weak_durability: true in the ledger options: the topic is then created with the replicas "
                    "the cluster has (or with replication_factor and min_insync_replicas given next to it); "
                    "`stream-vips topics create --config FILE --single-broker` creates every configured topic for "
                    "one broker") from exc
            raise
        self._producer = producer_client(connection, connection.client_id(f"ledger-{name}"), dict(
            acks="all", enable_idempotence=True, transactional_id=f"{self.TRANSACTIONAL_PREFIX}{name}", linger_ms=0))
        try:
            self._producer.init_transactions()  # fences an older writer and aborts its open transaction
        except Exception as exc:
            denied = denial(exc, connection.security, grant_for(self._grants, "transactionalId", "Write"))
            if denied is None:
                raise
            discard_producer(self._producer)
            raise denied from None
        self._failed: Exception | None = None
        genesis, self._events, self._positions, self._windows = self._replay()
        if genesis is None:
            genesis = new_genesis(supersedes)
            self._commit([(f"{name}/genesis".encode(), encode_genesis(genesis).rstrip(b"\n"))], "ledger genesis")
            log.info("ledger %s/%s created with id %s", topic, name, genesis["ledger_id"])
        elif supersedes:
            raise LedgerCorrupt(f"ledger {topic!r}/{name!r} already has records; a reset needs a new ledger name")
        self._genesis = genesis

    @staticmethod
    def topic_spec(topic: str, replication_factor: int, min_insync_replicas: int,
                   allow_weak_durability: bool) -> TopicSpec:
        """The ledger topic: one partition, compacted (one key per step, never expired), and
        replicated so that a lost broker loses no step (at least 3 replicas unless
        ``allow_weak_durability``)."""
        return TopicSpec(topic, "privacy ledger", 1, replication_factor,
                         {"cleanup.policy": "compact", "min.insync.replicas": str(min_insync_replicas)},
                         min_replication=1 if allow_weak_durability else DURABLE_REPLICAS,
                         fits_cluster=allow_weak_durability,
                         risk="a lost broker disk loses the record of the spent budget for good (a restart is then "
                              "refused where a checkpoint or the model topic names the lost ledger, and starts again "
                              "at zero where nothing does)")

    def _weakened(self, spec: TopicSpec) -> TopicSpec:
        """``spec`` within the brokers the cluster has (allow_weak_durability), with a WARNING
        when that is below the durable 3 replicas / min.insync.replicas 2."""
        brokers, _ = describe_cluster(self._connection.servers, self._connection.security)
        fitted = spec.within(brokers)
        if (fitted.replication_factor < DURABLE_REPLICAS
                or int(fitted.configs["min.insync.replicas"]) < DURABLE_INSYNC):
            log.warning("ledger topic %r with %s on %d broker(s) (allow_weak_durability: true): %s",
                        spec.topic, fitted.durability(spec), brokers, spec.risk)
        return fitted

    def _replay(self) -> tuple[dict | None, list, list, list]:
        return read_ledger_topic(self._connection.servers, self.topic, self.name,
                                 security=self._connection.security, timeout_s=self.send_timeout_s,
                                 why=grant_for(self._grants, "topic", "Read").why)

    def append_many(self, entries: Sequence[tuple[Any, int | None]], window: int | None = None) -> int:
        """Commit ``(event, position)`` entries as the next steps, all in one transaction (a
        ``read_committed`` replay sees all or none); transient failures are retried for
        ``append_timeout_s``. Returns the first step.

        A retry reuses the step numbers only after the failed transaction was aborted. When the
        outcome is unknown (the abort fails, e.g. the commit itself was interrupted) the ledger
        refuses further appends: a restart replays what was committed, so a step number is never
        used twice.
        """
        first = len(self._events)
        records = [(f"{self.name}/{first + i:012d}".encode(), encode_line(first + i, e, p, window).rstrip(b"\n"))
                   for i, (e, p) in enumerate(entries)]
        what = f"ledger events for steps {first}..{first + len(records) - 1}"
        self._commit(records, what)
        return self._record(entries, window)

    def _commit(self, records: Sequence[tuple[bytes, bytes]], what: str) -> None:
        if self._failed is not None:
            raise KafkaPublishError(
                f"ledger {self.name!r} refused further appends after a failed one ({self._failed}); "
                "restart to replay what was committed")
        deadline = time.monotonic() + self.append_timeout_s
        while True:
            try:
                self._producer.begin()
                handles = [self._producer.send(self.topic, v, k, partition=0) for k, v in records]
                self._producer.confirm(handles, self.send_timeout_s, what)
                self._producer.commit()
                return
            except Exception as exc:
                if _fenced(exc):  # a fenced producer commits nothing: the outcome is known
                    self._failed = KafkaPublishError(
                        f"ledger {self.name!r} on topic {self.topic!r} was opened by another process, which fenced "
                        f"this one: {what} was not committed and this process must stop (the other one now "
                        "holds the budget; run one service per ledger)")
                    raise self._failed from exc
                error = exc if isinstance(exc, KafkaPublishError) else KafkaPublishError(
                    f"{what} was not committed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc.__cause__ if isinstance(exc, KafkaPublishError) else exc
                try:
                    self._producer.abort()
                except Exception as abort_exc:
                    log.error("aborting the ledger transaction failed (%s): outcome of %s unknown", abort_exc, what)
                    self._failed = error
                    raise error from exc
                if not retriable(error) or time.monotonic() >= deadline:
                    raise error from exc
                log.warning("%s; retrying", error)
                time.sleep(0.5)

    def close(self) -> None:
        self._producer.close(self.send_timeout_s)


def _first_step(line: bytes) -> Any:
    """The ``step`` of a ledger line, ``None`` when it cannot be read (the replay then says why)."""
    try:
        return json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None


def _fenced(exc: BaseException | None) -> bool:
    """Whether ``exc`` or its cause is a producer fenced by a newer one with the same
    transactional id (kafka-python's ``ProducerFencedError``, librdkafka's ``_FENCED``)."""
    while exc is not None:
        if "Fenced" in type(exc).__name__ or "FENCED" in str(exc):
            return True
        exc = exc.__cause__
    return False


def read_ledger_topic(servers: str | list[str], topic: str, name: str, *, security: Mapping[str, Any] | None = None,
                      timeout_s: float = 30.0,
                      why: str = "reading the ledger"
                      ) -> tuple[dict | None, list, list, list]:
    """The committed steps of ledger ``name`` on ``topic``, read-only: ``(genesis, events,
    positions, windows)``, ``(None, [], [], [])`` when the name has no records; :class:`LedgerCorrupt` on a gap
    or a bad checksum. What :class:`KafkaLedger` replays on open, and what ``stream-vips report``
    reads (without fencing the running writer)."""
    prefix = f"{name}/".encode()
    genesis_key = prefix + b"genesis"
    genesis_line, lines = None, []
    for rec in read_topic(servers, topic, security=security, timeout_s=timeout_s, why=why):
        if rec.key == genesis_key:
            genesis_line = rec.value
        elif rec.key is not None and rec.key.startswith(prefix):
            lines.append(rec.value)
    if genesis_line is None and not lines:
        return None, [], [], []
    where = f"ledger topic {topic!r} name {name!r}"
    if genesis_line is None and _first_step(lines[0]) not in (0, None):
        raise LedgerCorrupt(
            f"{where} has no genesis and does not start at step 0: its earlier records are gone (the topic "
            "was deleted and recreated, or a retention policy removed them), and the budget they recorded "
            "with them; restore the topic, or run `stream-vips reset` to start a new budget deliberately")
    if genesis_line is not None:
        lines.insert(0, genesis_line)
    replayed = replay_lines(lines, where)
    if genesis_line is None:
        log.warning("%s has no genesis (written by an older version): its id is %s", where, replayed[0]["ledger_id"])
    return replayed
