"""``stream-vips topics``: create or check every Kafka topic a configuration names.

The topics are the Kafka source's input topics, the model topic (``sink``), the dead-letter
topic (``dead_letter``) and the Kafka ledger's topic (``privacy.ledger``). Each is created with,
or checked against, the settings its connector requires: the connector's own ``topic_spec``,
which the connector checks again at start (compaction, ``max.message.bytes``,
``min.insync.replicas``, replication). ``create`` makes the missing topics and checks the
existing ones without changing them; ``check`` only checks. Input topics are created with
``--partitions`` partitions (default 1; more partitions only help several consumers, and a
window-accounted service needs one) and the broker's default replication. A section with
``create_topic: false`` is only checked: its topics are someone else's (e.g. Strimzi's).

``--single-broker`` creates every topic with one replica and ``min.insync.replicas`` 1, and
says for each what that weakens; it needs ``allow_weak_durability: true`` on a Kafka ledger,
which refuses a topic with fewer than 3 replicas otherwise. Each section's own connection and
security settings are used.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # imported on use: --help stays free of the Kafka client
    from connectors.kafka import KafkaConnection
    from connectors.kafka.topics import TopicSpec
    from stream_vips.config import Config

PROG = "stream-vips topics"

EXIT_CODES = """exit codes: 0 every topic exists with the settings its connector requires; 1 a topic is
missing, could not be created, or exists with settings its connector refuses (it is left
unchanged); 2 bad configuration or option (the message names the key or flag); 5 the broker did
not answer within --timeout-s"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``topics`` (``create``, ``check``) on an ``add_subparsers()`` object."""
    from stream_vips.cli import plain

    p = subparsers.add_parser("topics", help="create or check every Kafka topic a configuration names",
                              description=plain(__doc__), epilog=EXIT_CODES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_line in (("create", "create the missing topics, check the existing ones"),
                              ("check", "check that every topic exists with the settings its connector requires")):
        a = actions.add_parser(action, help=help_line, description=help_line, epilog=EXIT_CODES,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        a.add_argument("--config", metavar="FILE", required=True, help="the YAML configuration of stream-vips run")
        a.add_argument("--timeout-s", type=float, default=30.0, metavar="S",
                       help="seconds to wait for the broker to answer, e.g. one still starting (default: %(default)s)")
        if action == "create":
            a.add_argument("--partitions", type=int, default=1, metavar="N",
                           help="partitions of each input topic created (default: %(default)s)")
            a.add_argument("--single-broker", action="store_true",
                           help="one replica and min.insync.replicas 1 per topic (development on one broker)")
    return p


class Planned(NamedTuple):
    """One configured topic: the configuration key that names it, the spec its connector
    requires as configured, the section's connection, and whether it may be created."""

    key: str
    spec: TopicSpec
    connection: KafkaConnection
    create: bool


def planned_topics(config: Config, partitions: int) -> list[Planned]:
    """Every Kafka topic of ``config``; a :class:`~stream_vips.config.ConfigError` names a
    section whose connection settings are bad."""
    from connectors import connector_class
    from connectors.kafka import KafkaConnectorError, KafkaLedger
    from connectors.kafka.topics import connection_of, options_of, spec_of
    from stream_vips.config import ConfigError

    sections = [(kind, connector_class(kind, "kafka"), getattr(config, kind).options)
                for kind in ("source", "sink", "dead_letter") if getattr(config, kind).type == "kafka"]
    if config.privacy.ledger.type == "kafka":
        sections.append(("privacy.ledger.options", KafkaLedger, config.privacy.ledger.options))
    out = []
    for section, cls, options in sections:
        try:
            connection = connection_of(options)
        except KafkaConnectorError as exc:
            raise ConfigError(f"{section}: {exc}") from None
        create = options_of(cls, options).get("create_topic", True)
        extra = {"partitions": partitions} if section == "source" else {}
        key = f"{section}.topics" if section == "source" else f"{section}.topic"
        out.extend(Planned(key, spec, connection, create) for spec in spec_of(cls, options, **extra))
    return out


def run(args: argparse.Namespace) -> int:
    """See :data:`EXIT_CODES`."""
    from stream_vips.cli.inspect import BrokerUnreachable
    from stream_vips.config import ConfigError
    from stream_vips.service.build import load_config

    def fail(line: str, code: int) -> int:
        print(f"{PROG}: {line}", file=sys.stderr)
        return code

    create, single = args.action == "create", getattr(args, "single_broker", False)
    partitions = getattr(args, "partitions", 1)
    if not args.timeout_s > 0:
        return fail(f"--timeout-s must be > 0, got {args.timeout_s!r}", 2)
    if partitions < 1:
        return fail(f"--partitions must be >= 1, got {partitions}", 2)
    try:
        topics = planned_topics(load_config(args.config), partitions)
    except ConfigError as exc:
        return fail(f"configuration error: {exc}", 2)
    if not topics:
        return fail(f"{args.config} names no Kafka topic (source, sink, dead_letter and privacy.ledger are not "
                    "of type kafka)", 2)
    if single:
        if any(t.spec.min_replication > 1 for t in topics):
            return fail("privacy.ledger.options.allow_weak_durability: must be true with --single-broker: the "
                        "Kafka ledger refuses a topic with fewer than 3 replicas otherwise", 2)
        print("one broker: each topic gets 1 replica and min.insync.replicas 1, which weakens:")
        for t in topics:
            print(f"  {t.spec.topic} ({t.spec.role}): {t.spec.within(1).durability(t.spec)}: {t.spec.risk}")
    try:
        problems = sum(not settle(t, create, single, args.timeout_s) for t in topics)
    except BrokerUnreachable as exc:
        return fail(str(exc), 5)
    if problems:
        return fail(f"{problems} topic(s) not as their connectors require (above); no existing topic was changed", 1)
    return 0


def settle(planned: Planned, create: bool, single: bool, timeout_s: float) -> bool:
    """Create (``create``) or check one topic and print one line on it; whether it is as its
    connector requires. :class:`~stream_vips.cli.inspect.BrokerUnreachable` when Kafka fails."""
    from connectors.kafka import KafkaConnectorError
    from connectors.kafka.topics import describe_cluster, too_few_brokers
    from stream_vips.cli.inspect import BrokerUnreachable, deadline_options, error_text
    from stream_vips.cli.run import connector_failure

    key, configured, connection, may_create = planned
    security = {**connection.security, **deadline_options(timeout_s)}
    name = f"{configured.topic} ({configured.role}, {key})"
    existing: set[str] = set()
    try:
        brokers, existing = describe_cluster(connection.servers, security)
        if single:
            spec = configured.within(1)
        elif configured.fits_cluster:  # as the connector does at start (the ledger's allow_weak_durability)
            spec = configured.within(brokers)
        else:
            spec = configured
        if spec.topic not in existing and not (create and may_create):
            owner = " (create_topic is false: its owner creates it)" if create else ""
            print(f"{name}: MISSING{owner}")
            return False
        settings = spec.ensure(connection.servers, security, create=create and may_create)
    except KafkaConnectorError as exc:
        state = "INCOMPATIBLE" if configured.topic in existing else "NOT CREATED"
        hint = " (fewer brokers than replicas: on one broker use --single-broker)" if too_few_brokers(exc) else ""
        print(f"{name}: {state}: {exc}{hint}")
        return False
    except Exception as exc:
        if not connector_failure(exc):
            raise
        raise BrokerUnreachable(f"Kafka at {','.join(connection.servers)}: {error_text(exc)} (waited up to "
                                f"--timeout-s {timeout_s:g})") from None
    if configured.topic in existing:
        print(f"{name}: exists, fine" + "".join(f", {k}={v}" for k, v in sorted(settings.items())))
    else:  # the replication settings as created (and what they replace), then the others
        print(f"{name}: created: {spec.partitions} partition(s), {spec.durability(configured)}"
              + "".join(f", {k}={v}" for k, v in sorted(settings.items()) if k != "min.insync.replicas"))
    return True
