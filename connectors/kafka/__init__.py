"""Kafka connectors: record source, model sink, dead-letter sink and durable ledger, on
kafka-python (the default) or confluent-kafka (``client: confluent``).

The modules form layers, each importing only from the layers below it (no cycle, and no private
name imported from another module; tests/test_kafka_layers.py checks both), from the bottom up:

* :mod:`.errors` -- the connector errors (:class:`KafkaConnectorError`, :class:`KafkaPublishError`,
  :class:`KafkaAccessDenied`: the broker refused a login or an operation), a commit the group
  refused, and which failures of either client library are worth a retry.
* :mod:`.connection` -- :class:`KafkaConnection`: bootstrap servers, security settings (unset
  ones from ``STREAM_VIPS_KAFKA_<NAME>`` environment variables), reconnect backoff, client id
  prefix and client library, turned into kafka-python's keyword arguments in one place.
* :mod:`.rebalance` -- the hooks a consumer client calls when the group's assignment changes.
* :mod:`.kafka_python` and :mod:`.confluent` -- each client library behind the seam
  (kafka-python's rebalance listener; librdkafka names, rebalance callbacks, delivery reports, the
  guarded librdkafka logger).
* :mod:`.clients` -- the seam between the connectors' rules and a client library (consumer and
  producer), and the factories that pick a connection's library.
* :mod:`.access` -- :class:`Grant`, the ACLs each connector declares (``grants(...)``), checked at
  start, and :func:`denial`, a broker refusal of either client library named as the grant it needs.
* :mod:`.admin` -- :func:`ensure_topic` (create, or check an existing topic's settings and
  replication), :func:`read_topic` (every committed record).
* :mod:`.topics` -- :class:`~connectors.kafka.topics.TopicSpec`: what each connector requires of
  its topic, stated once by the connector's ``topic_spec`` and used by its constructor and by
  ``stream-vips topics``.
* the connectors, none of which imports another:

  * :mod:`.source` -- :class:`KafkaSource`, a consumer-group member with manual offset commits,
    bounded polls and a keep-alive during long updates.
  * :mod:`.sink` -- :class:`KafkaModelSink`, model messages on a compacted topic keyed by model id,
    chunked in one transaction when too large (:class:`Reassembler` puts them together).
  * :mod:`.dead_letters` -- :class:`KafkaDeadLetterSink`, rejected records with their original
    bytes and the reason and source position in headers.
  * :mod:`.ledger` -- :class:`KafkaLedger`, the privacy ledger on a compacted topic written by a
    transactional producer; :func:`read_ledger_topic` reads one read-only.

Every connector takes its connection settings as flat keyword arguments (the configuration
keys) or as one ``connection: KafkaConnection``. Importing the package guards the Kafka client's
loggers (:func:`stream_vips.logsafety.guard_client_logging`).
"""

from connectors.kafka.access import Grant, connector_grants
from connectors.kafka.admin import ensure_topic, read_topic
from connectors.kafka.connection import (
    ENV_PREFIX,
    FILE_KEYS,
    SECURITY_KEYS,
    KafkaConnection,
    principal,
    security_options,
    server_list,
)
from connectors.kafka.dead_letters import KafkaDeadLetterSink, dead_letter_from_record, dead_letter_reasons
from connectors.kafka.errors import KafkaAccessDenied, KafkaConnectorError, KafkaPublishError
from connectors.kafka.kafka_python import SeekListener
from connectors.kafka.ledger import KafkaLedger, read_ledger_topic
from connectors.kafka.sink import (
    CHUNK_HEADER,
    MESSAGE_ID_HEADER,
    RECORD_OVERHEAD,
    SHA256_HEADER,
    KafkaModelSink,
    Reassembler,
    chunk_info,
    chunk_payload,
)
from connectors.kafka.source import KafkaSource

__all__ = [
    "CHUNK_HEADER",
    "ENV_PREFIX",
    "FILE_KEYS",
    "Grant",
    "MESSAGE_ID_HEADER",
    "RECORD_OVERHEAD",
    "SECURITY_KEYS",
    "SHA256_HEADER",
    "KafkaAccessDenied",
    "KafkaConnection",
    "KafkaConnectorError",
    "KafkaDeadLetterSink",
    "KafkaLedger",
    "KafkaModelSink",
    "KafkaPublishError",
    "KafkaSource",
    "Reassembler",
    "SeekListener",
    "chunk_info",
    "chunk_payload",
    "connector_grants",
    "dead_letter_from_record",
    "dead_letter_reasons",
    "ensure_topic",
    "principal",
    "read_ledger_topic",
    "read_topic",
    "security_options",
    "server_list",
]
