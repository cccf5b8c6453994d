"""Connectors: the I/O implementations of :mod:`stream_vips.io` (files, stdio, memory, synthetic, Kafka).

The registries map a configuration ``type`` to an import path ``"module:Class"`` so that a
connector's dependencies are imported only when it is used. A connector's constructor keyword
arguments are its configuration keys (``stream_vips.config`` validates them against the signature).

Looking up a Kafka connector also guards the Kafka client's loggers
(:func:`stream_vips.logsafety.guard_client_logging`): at DEBUG they would log raw record bytes.
"""

from __future__ import annotations

import importlib
from typing import Any

SOURCES: dict[str, str] = {
    "memory": "connectors.memory:MemorySource",
    "jsonl": "connectors.jsonl:JsonlSource",
    "stdin": "connectors.stdio:StdinSource",
    "synthetic": "connectors.synthetic:SyntheticRegressionSource",
    "synthetic_logistic": "connectors.synthetic:SyntheticLogisticSource",
    "synthetic_lda": "connectors.synthetic:SyntheticLdaSource",
    "synthetic_nonlinear": "connectors.synthetic:SyntheticNonlinearSource",
    "synthetic_sbn": "connectors.synthetic:SyntheticSbnSource",
    "kafka": "connectors.kafka:KafkaSource",
}
SINKS: dict[str, str] = {
    "memory": "connectors.memory:MemorySink",
    "jsonl": "connectors.jsonl:JsonlSink",
    "stdout": "connectors.stdio:StdoutSink",
    "kafka": "connectors.kafka:KafkaModelSink",
}
DEAD_LETTER_SINKS: dict[str, str] = {
    "memory": "connectors.memory:MemoryDeadLetterSink",
    "jsonl": "connectors.jsonl:JsonlDeadLetterSink",
    "stderr": "connectors.stdio:StderrDeadLetterSink",
    "kafka": "connectors.kafka:KafkaDeadLetterSink",
}
REGISTRIES: dict[str, dict[str, str]] = {
    "source": SOURCES,
    "sink": SINKS,
    "dead_letter": DEAD_LETTER_SINKS,
}


def connector_class(kind: str, type_name: str) -> type:
    """The class registered for ``kind`` ("source", "sink", "dead_letter") and ``type_name``."""
    registry = REGISTRIES[kind]
    if type_name not in registry:
        raise KeyError(f"unknown {kind} type {type_name!r}; known: {sorted(registry)}")
    module_name, _, attr = registry[type_name].partition(":")
    if module_name == "connectors.kafka":
        from stream_vips.logsafety import guard_client_logging

        guard_client_logging()  # library users get it too, not only the CLI
    return getattr(importlib.import_module(module_name), attr)


def build_connector(kind: str, type_name: str, options: dict[str, Any]) -> Any:
    """Instantiate the connector ``type_name`` of ``kind`` with keyword ``options``."""
    return connector_class(kind, type_name)(**options)
