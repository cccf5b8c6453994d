"""Keep record bytes out of the logs: a floor and a filter for the Kafka client's loggers.

Logs are a release like any other (the README's guarantee covers them), yet kafka-python logs
raw wire data at DEBUG: ``kafka.protocol.parser`` writes every byte sent and received
(``Send: b'...'``, ``Recv: b'...'``, including fetched record values and produced dead letters)
and ``kafka.net.connection`` writes the repr of every request and response (a
``FetchResponse`` repr holds the record batches). With the root logger at DEBUG
(``stream-vips run --log-level DEBUG``) all of that reaches the handlers. The confluent-kafka
client (``client: confluent``) logs librdkafka's lines through ``kafka.librdkafka``, inside the
same family, and never enables librdkafka's debug contexts.

:func:`guard_client_logging` closes this:

* **floor** -- the ``kafka`` logger gets level INFO (kept higher if it already is), and every
  existing ``kafka.*`` logger with an explicit level below INFO is raised to INFO, so the
  client's DEBUG calls are no-ops whatever the root level is (no record is even created);
* **filter** -- on ``kafka`` and every ``kafka.*`` logger that exists when it runs (all of the
  client's modules, since it imports the client first) a :class:`ClientPayloadFilter` drops
  anything below INFO (a later ``setLevel(DEBUG)`` on one client logger does not reopen it)
  and redacts, at every level, arguments that are raw bytes (shown as ``<N bytes redacted>``)
  or protocol/record objects (shown as ``<ClassName redacted>``).

What is kept: the client's INFO, WARNING and ERROR lines -- connections, bootstrap, metadata
updates, group membership, partition assignments, offsets, producer ids and broker error
codes. Their arguments were checked in kafka-python 3.0.12: none carries record keys, values
or headers, with one exception, ``kafka.protocol.parser``'s ERROR "Unable to decode N-byte
buffer: %r" (the whole undecodable response, which may be a fetch response), whose bytes the
filter redacts. Tracebacks (``log.exception``) show code and exception messages; the client's
exceptions do not quote record contents.

Opt-out, **unsafe**: ``STREAM_VIPS_UNSAFE_CLIENT_DEBUG=1`` leaves (or puts back) the client's
loggers as they were, so a client or protocol problem can be debugged at DEBUG. Record bytes
then reach the logs and the privacy guarantee no longer covers them; a WARNING says so. Use
it only on test data, never on a production stream. It exists because the alternative --
patching logging by hand to chase a broker issue -- is easier to leave on unnoticed than a
named switch that announces itself on every start.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

#: The root of kafka-python's logger hierarchy (every client module logs below it).
CLIENT_LOGGER = "kafka"
#: Lowest level of the client's records that may reach a handler.
CLIENT_FLOOR = logging.INFO
#: Set to ``1`` to leave the client's loggers unguarded (unsafe: raw record bytes in DEBUG logs).
UNSAFE_ENV = "STREAM_VIPS_UNSAFE_CLIENT_DEBUG"

log = logging.getLogger("stream_vips.logsafety")

#: Levels this module replaced, logger name -> previous level (restored by the opt-out).
_previous_levels: dict[str, int] = {}
_warned_unsafe = False


def _redact(value: Any, depth: int = 3) -> Any:
    """``value`` itself, unless it is raw bytes or a kafka-python protocol/record object; lists,
    tuples, sets and dict values (e.g. record headers) are redacted inside, ``depth`` levels deep."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes redacted>"
    module = type(value).__module__ or ""
    if module.startswith(("kafka.protocol", "kafka.record")):
        return f"<{type(value).__name__} redacted>"
    if depth > 0 and isinstance(value, (list, tuple, set, frozenset)):
        items = [_redact(v, depth - 1) for v in value]
        if hasattr(value, "_fields"):  # a namedtuple (TopicPartition, OffsetAndMetadata, ...)
            return type(value)(*items)
        return type(value)(items)
    if depth > 0 and isinstance(value, dict):
        return {k: _redact(v, depth - 1) for k, v in value.items()}
    return value


class ClientPayloadFilter(logging.Filter):
    """Drops client log records below :data:`CLIENT_FLOOR` and redacts payload-carrying arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < CLIENT_FLOOR:
            return False
        record.msg = _redact(record.msg)
        if isinstance(record.args, Mapping):
            record.args = {k: _redact(v) for k, v in record.args.items()}
        elif record.args:
            record.args = tuple(_redact(a) for a in record.args)
        return True


def _client_loggers() -> list[logging.Logger]:
    """The ``kafka`` logger and every ``kafka.*`` logger created so far."""
    names = [n for n in list(logging.root.manager.loggerDict) if n.startswith(CLIENT_LOGGER + ".")]
    return [logging.getLogger(CLIENT_LOGGER)] + [logging.getLogger(n) for n in sorted(names)]


def unsafe_client_debug(env: Mapping[str, str] | None = None) -> bool:
    """True when ``STREAM_VIPS_UNSAFE_CLIENT_DEBUG=1`` asks for unguarded client logging."""
    return (os.environ if env is None else env).get(UNSAFE_ENV, "").strip() == "1"


def guard_client_logging(env: Mapping[str, str] | None = None) -> bool:
    """Apply the floor and the filter to the Kafka client's loggers; returns True when guarded.

    Idempotent and cheap: the CLI calls it after configuring logging and
    :func:`connectors.connector_class` calls it whenever a Kafka connector is looked up, so
    library users are covered too. With the unsafe opt-out set it removes what an earlier call
    installed, logs a WARNING and returns False.
    """
    global _warned_unsafe
    try:
        import kafka  # noqa: F401  -- creates the client's loggers so the filter reaches all of them
    except ImportError:
        pass
    loggers = _client_loggers()
    if unsafe_client_debug(env):
        for logger in loggers:
            for f in [f for f in logger.filters if isinstance(f, ClientPayloadFilter)]:
                logger.removeFilter(f)
            if logger.name in _previous_levels:
                logger.setLevel(_previous_levels.pop(logger.name))
        if not _warned_unsafe:
            log.warning("%s=1: the Kafka client's loggers are not guarded; at DEBUG they write raw record "
                        "bytes, which the privacy guarantee does not cover (test data only)", UNSAFE_ENV)
            _warned_unsafe = True
        return False
    _warned_unsafe = False
    for logger in loggers:
        is_root = logger.name == CLIENT_LOGGER
        if (is_root and logger.level < CLIENT_FLOOR) or (not is_root and 0 < logger.level < CLIENT_FLOOR):
            _previous_levels.setdefault(logger.name, logger.level)
            logger.setLevel(CLIENT_FLOOR)
        if not any(isinstance(f, ClientPayloadFilter) for f in logger.filters):
            logger.addFilter(ClientPayloadFilter())
    return True
