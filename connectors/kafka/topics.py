"""What each Kafka connector requires of its topic, stated once per connector.

Every Kafka connector has a static ``topic_spec`` (the source: ``topic_specs``) that turns its own
options into a :class:`TopicSpec`: partitions, replication, the topic settings it depends on
(compaction, ``max.message.bytes``, ``min.insync.replicas``) and what a single copy of the topic
risks. The connector's constructor creates or checks its topic with that spec, and
``stream-vips topics`` creates and checks every configured topic with the same specs
(:func:`spec_of` binds a configuration section's options to them), so the two cannot drift.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.kafka.access import Grant
from connectors.kafka.admin import ensure_topic
from connectors.kafka.connection import KafkaConnection, server_list

#: ``replication_factor`` of a spec that leaves it to the broker (``default.replication.factor``).
BROKER_DEFAULT = -1


@dataclass(frozen=True)
class TopicSpec:
    """A topic as a connector needs it. ``configs`` are created with the topic and checked on an
    existing one (by :func:`~connectors.kafka.admin.ensure_topic`); ``min_replication`` is the
    fewest replicas an existing topic may have; ``fits_cluster``: the connector takes the spec
    :meth:`within` the brokers the cluster has rather than be refused (the ledger's
    ``allow_weak_durability``); ``risk`` says what a single replica loses."""

    topic: str
    role: str
    partitions: int = 1
    replication_factor: int = BROKER_DEFAULT
    configs: Mapping[str, str] = field(default_factory=dict)
    min_replication: int = 1
    fits_cluster: bool = False
    risk: str = ""

    def within(self, brokers: int) -> TopicSpec:
        """This spec on a cluster of ``brokers``: at most that many replicas, and
        ``min.insync.replicas`` and the replicas required at most the replication."""
        replicas = brokers if self.replication_factor == BROKER_DEFAULT else min(self.replication_factor, brokers)
        configs = dict(self.configs)
        if "min.insync.replicas" in configs:
            configs["min.insync.replicas"] = str(min(int(configs["min.insync.replicas"]), replicas))
        return dataclasses.replace(self, replication_factor=replicas, configs=configs,
                                   min_replication=min(self.min_replication, replicas))

    def durability(self, configured: TopicSpec | None = None) -> str:
        """``replication R, min.insync.replicas M`` (the latter when set), each followed by the
        ``configured`` value where it differs."""
        before = _durability(configured) if configured is not None else {}
        return ", ".join(f"{name} {value}" + (f" (instead of {before[name]})" if before.get(name, value) != value
                                              else "") for name, value in _durability(self).items())

    def ensure(self, servers: str | Sequence[str], security: Mapping[str, Any], create: bool = True,
               grants: Sequence[Grant] = ()) -> dict[str, str]:
        """Create the topic if ``create`` and it is missing, else check it (and the connector's
        ``grants`` first); the effective values of :attr:`configs`. :class:`KafkaConnectorError`
        names what is missing or incompatible, :class:`KafkaAccessDenied` the ACL missing."""
        return ensure_topic(servers, self.topic, partitions=self.partitions, replication_factor=self.replication_factor,
                            configs=self.configs, create=create, security=security,
                            min_replication=self.min_replication, grants=grants)


def _durability(spec: TopicSpec) -> dict[str, str]:
    replicas = "the broker's default" if spec.replication_factor == BROKER_DEFAULT else str(spec.replication_factor)
    insync = spec.configs.get("min.insync.replicas")
    return {"replication": replicas, **({"min.insync.replicas": insync} if insync is not None else {})}


def options_of(cls: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """A Kafka connector's configuration ``options`` with its constructor's defaults filled in."""
    bound = inspect.signature(cls).bind_partial(**options)
    bound.apply_defaults()
    return bound.arguments


def spec_of(cls: type, options: Mapping[str, Any], **extra: Any) -> list[TopicSpec]:
    """The topics a Kafka connector class needs with these configuration ``options`` (its
    constructor's keyword arguments): its ``topic_spec`` (or the source's ``topic_specs``)
    called with the options it names, plus ``extra`` (the source's partitions)."""
    function = getattr(cls, "topic_specs", None) or cls.topic_spec
    wanted = {**options_of(cls, options), **extra}
    specs = function(**{name: wanted[name] for name in inspect.signature(function).parameters})
    return list(specs) if isinstance(specs, (list, tuple)) else [specs]


def connection_of(options: Mapping[str, Any]) -> KafkaConnection:
    """The :class:`KafkaConnection` a connector builds from its flat configuration ``options``."""
    names = {f.name for f in dataclasses.fields(KafkaConnection) if f.init}
    return KafkaConnection(**{k: v for k, v in options.items() if k in names})


def describe_cluster(servers: str | Sequence[str], security: Mapping[str, Any]) -> tuple[int, set[str]]:
    """``(brokers, topic names)`` of the cluster at ``servers``; fenced brokers (which take no new
    replicas) are not counted."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=server_list(servers), **dict(security))
    try:
        brokers = [b for b in admin.describe_cluster().get("brokers") or () if not b.get("is_fenced")]
        return len(brokers), set(admin.list_topics())
    finally:
        admin.close()


def too_few_brokers(exc: BaseException) -> bool:
    """Whether ``exc`` is a topic creation the cluster refused for want of brokers."""
    from kafka.errors import InvalidReplicationFactorError

    return isinstance(exc.__cause__, InvalidReplicationFactorError)
