"""Topic administration and reading shared by the Kafka connectors: create or check a topic's
settings (:func:`ensure_topic`) and read a topic's committed records (:func:`read_topic`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.kafka.access import (
    UNKNOWN_TOPIC_OR_PARTITION,
    Grant,
    authenticate,
    check_access,
    check_grants,
    denial,
    open_admin,
)
from connectors.kafka.connection import server_list
from connectors.kafka.errors import KafkaConnectorError


def ensure_topic(bootstrap_servers: str | Sequence[str], topic: str, *, partitions: int = 1,
                 replication_factor: int = 1, configs: Mapping[str, str] | None = None,
                 create: bool = True, security: Mapping[str, Any] | None = None,
                 min_replication: int = 1, grants: Sequence[Grant] = ()) -> dict[str, str]:
    """Create ``topic`` with ``configs`` if allowed and missing, else check its settings.

    First the access: the caller's ``grants`` (what its connector needs, :mod:`.access`) and
    DescribeConfigs on the topic, which reading its settings needs; a refusal raises
    :class:`KafkaAccessDenied` naming the missing ACL, and so does a refused creation (Create).
    A topic the principal may not describe is reported as such (Kafka does not say whether it
    exists), not as missing.

    An existing topic with fewer than ``min_replication`` replicas on some partition is refused
    too (the ledger's durability rule), and so is one whose ``min.insync.replicas`` exceeds its
    replicas: every ``acks=all`` write would be refused, and a service that cannot publish the
    model of a step it paid for would pay again at each restart.

    An existing topic whose value for one of ``configs`` differs raises
    :class:`KafkaConnectorError` naming the setting (a model topic that is not compacted would
    lose nothing at first and the history later; refusing to start is the safe answer); so does
    a topic whose settings the broker does not return (the check is never skipped). Returns the
    topic's effective settings for the checked keys.
    """
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    security = dict(security or {})
    wanted = {k: str(v) for k, v in (configs or {}).items()}
    reading = Grant("topic", topic, "DescribeConfigs", "checking the topic's settings at start",
                    "connectors.kafka.admin.ensure_topic")
    needed = list({(g.resource_type, g.name, g.operation): g for g in (reading, *grants)}.values())
    admin = open_admin(bootstrap_servers, security)
    try:
        check_grants(admin, security, needed)
        (found,) = admin.describe_topics([topic])
        if found["error_code"] == UNKNOWN_TOPIC_OR_PARTITION:
            if not create:
                raise KafkaConnectorError(f"topic {topic!r} does not exist and create_topic is false")
            try:
                admin.create_topics([NewTopic(topic, partitions, replication_factor, topic_configs=wanted)])
            except TopicAlreadyExistsError:
                pass  # created concurrently: check its settings below
            except KafkaError as exc:
                creating = Grant("topic", topic, "Create", "creating the missing topic with create_topic: true",
                                 "connectors.kafka.admin.ensure_topic")
                denied = denial(exc, security, creating)
                if denied is not None:
                    raise denied from None
                raise KafkaConnectorError(f"cannot create topic {topic!r} with replication factor "
                                          f"{replication_factor}: {type(exc).__name__}") from exc
            check_grants(admin, security, needed)  # it exists now
        deadline = time.monotonic() + 10.0
        while True:  # a topic created a moment ago may be described with no settings at all yet
            # "all": effective values, broker defaults included (kafka-python's default lists only
            # the ones set on the topic, so a topic left at the defaults looked unset)
            res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
            actual = _config_values(res, topic)
            if actual or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not actual:
            raise KafkaConnectorError(f"topic {topic!r}: the broker returned none of its settings within 10 s, "
                                      "so they cannot be checked")
        replicas = min(
            (len(p.get("replica_nodes", ())) for t in admin.describe_topics([topic]) for p in t.get("partitions", ())),
            default=0)
    finally:
        admin.close()
    if replicas < min_replication:
        raise KafkaConnectorError(f"topic {topic!r} has {replicas} replica(s) on some partition; "
                                  f"at least {min_replication} are needed")
    insync = actual.get("min.insync.replicas")
    if insync is not None and int(insync) > replicas:  # "at least" would accept it otherwise
        raise KafkaConnectorError(
            f"topic {topic!r} has {replicas} replica(s) on some partition but min.insync.replicas="
            f"{actual['min.insync.replicas']}: every acks=all write to it would be refused")
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


def read_topic(bootstrap_servers: str | list[str], topic: str, *, security: Mapping[str, Any] | None = None,
               timeout_s: float = 30.0, settle_s: float = 5.0,
               why: str = "reading the whole topic") -> list[Any]:
    """Every committed record of ``topic`` from the beginning to the current end, per partition
    in offset order (partitions one after another).

    A transaction's commit markers reach a partition shortly after the producer's commit
    returns; until then the committed end stops before it. So once the committed end is reached,
    reading goes on (for at most ``settle_s``) until it reaches the high watermarks the partitions
    had when the read began (records written since do not matter, so busy writers with short
    transactions do not hold it up). A transaction that stays open (another writer on the topic
    killed mid-append, until its ``transaction.timeout.ms``) keeps a ``read_committed`` reader
    before it, and every record committed after it is hidden too: then
    :class:`KafkaConnectorError` is raised rather than a list that silently misses them (a
    ledger replayed short would count fewer steps than were paid). ``timeout_s`` bounds a stall
    (no record for that long), not the whole read, so a long topic is read whatever its length.
    A refused login or a missing Read ACL raises :class:`KafkaAccessDenied` (``why`` says who reads)."""
    from kafka import KafkaConsumer

    security = dict(security or {})
    reading = Grant("topic", topic, "Read", why, "connectors.kafka.admin.read_topic")
    authenticate(bootstrap_servers, security)
    consumer = KafkaConsumer(bootstrap_servers=server_list(bootstrap_servers), group_id=None,
                             enable_auto_commit=False, isolation_level="read_committed", **security)
    try:
        return _read_all(consumer, bootstrap_servers, topic, security, timeout_s, settle_s, reading)
    except Exception as exc:
        denied = denial(exc, security, reading, server_list(bootstrap_servers))
        if denied is not None:
            raise denied from None
        raise
    finally:
        consumer.close(autocommit=False)


def _read_all(consumer: Any, bootstrap_servers: str | list[str], topic: str, security: Mapping[str, Any],
              timeout_s: float, settle_s: float, reading: Grant) -> list[Any]:
    """:func:`read_topic`'s work on an open consumer."""
    from kafka.structs import TopicPartition

    parts = consumer.partitions_for_topic(topic)
    if not parts:  # not known to this principal: refused, or really missing
        check_access(bootstrap_servers, security, [reading])
        raise KafkaConnectorError(f"topic {topic!r} does not exist")
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    tops = _high_watermarks(bootstrap_servers, tps, security)  # this read must reach them
    out: dict[Any, list] = {tp: [] for tp in tps}
    deadline = time.monotonic() + timeout_s
    while any(consumer.position(tp) < ends[tp] for tp in tps):
        if time.monotonic() > deadline:
            raise KafkaConnectorError(f"reading topic {topic!r} stalled: no record for {timeout_s}s")
        for tp, recs in consumer.poll(timeout_ms=500).items():
            out[tp].extend(recs)
            deadline = time.monotonic() + timeout_s
    settled = time.monotonic() + settle_s
    behind = tps
    while behind:
        behind = [tp for tp in tps if consumer.position(tp) < tops[tp]]
        if behind and time.monotonic() >= settled:
            where = ", ".join(f"partition {tp.partition} at offset {consumer.position(tp)} of "
                              f"{tops[tp]}" for tp in behind)
            raise KafkaConnectorError(
                f"topic {topic!r} has records a read_committed reader cannot reach ({where}): a "
                "transaction left open by another writer hides everything committed after it; "
                "retry once it times out (transaction.timeout.ms) or abort it with kafka-transactions.sh")
        for tp, recs in consumer.poll(timeout_ms=100).items():
            out[tp].extend(recs)
    return [r for tp in tps for r in out[tp]]


def _high_watermarks(bootstrap_servers: str | list[str], tps: list, security: Mapping[str, Any] | None) -> dict:
    """The partitions' ends counting uncommitted records (a ``read_committed`` consumer's
    ``end_offsets`` stop at the first open transaction instead)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=server_list(bootstrap_servers), group_id=None, enable_auto_commit=False,
                             isolation_level="read_uncommitted", **dict(security or {}))
    try:
        return consumer.end_offsets(tps)
    finally:
        consumer.close(autocommit=False)

