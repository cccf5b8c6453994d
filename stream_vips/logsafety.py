"""Keep record bytes and credentials out of the logs: a floor and two filters for the Kafka client's loggers.

Logs are a release like any other (the README's guarantee covers them), yet kafka-python logs
raw wire data at DEBUG: ``kafka.protocol.parser`` writes every byte sent and received
(``Send: b'...'``, ``Recv: b'...'``, including fetched record values and produced dead letters)
and ``kafka.net.connection`` writes the repr of every request and response (a
``FetchResponse`` repr holds the record batches). With the root logger at DEBUG
(``stream-vips run --log-level DEBUG``) all of that reaches the handlers. The confluent-kafka
client (``client: confluent``) logs librdkafka's lines through ``kafka.librdkafka``, inside the
same family, and never enables librdkafka's debug contexts. kafka-python's admin client also
logs its whole configuration at DEBUG, SASL password included.

:func:`guard_client_logging` closes this:

* **floor** -- the ``kafka`` logger gets level WARNING, or INFO when the run logs at DEBUG (the
  root logger's level when the guard runs: ``--log-level DEBUG`` / ``runtime.log_level: DEBUG``);
  a level above WARNING that someone chose (ERROR) is kept; every existing ``kafka.*`` logger with an explicit
  level below the floor is raised to it. So the client's connection chatter (connections, bootstraps,
  metadata updates, one INFO line per broker round) stays out of an INFO log, and the client's
  DEBUG calls are no-ops whatever the root level is (no record is even created); the floor is
  never below INFO;
* **payload filter** -- on ``kafka`` and every ``kafka.*`` logger that exists when it runs (all
  of the client's modules, since it imports the client first) a :class:`ClientPayloadFilter`
  drops anything below the floor (a later ``setLevel(DEBUG)`` on one client logger does not
  reopen it) and redacts, at every level, arguments that are raw bytes (shown as
  ``<N bytes redacted>``) or protocol/record objects (shown as ``<ClassName redacted>``);
* **secret filter** -- on the same loggers a :class:`ClientSecretFilter` replaces the value of
  every secret-named key (:func:`is_secret`: a configuration dict's ``sasl_plain_password``) and
  every credential the connectors resolved (:func:`register_secret`, wherever it appears in a
  message) by ``<redacted>``.

What is kept: the client's WARNING and ERROR lines (and at DEBUG its INFO lines) -- connections,
bootstrap, metadata updates, group membership, partition assignments, offsets, producer ids and
broker error codes. Their arguments were checked in kafka-python 3.0.12: none carries record
keys, values or headers, with one exception, ``kafka.protocol.parser``'s ERROR "Unable to decode
N-byte buffer: %r" (the whole undecodable response, which may be a fetch response), whose bytes
the payload filter redacts. Tracebacks (``log.exception``) show code and exception messages; the
client's exceptions do not quote record contents or credentials.

Opt-out, **unsafe**: ``STREAM_VIPS_UNSAFE_CLIENT_DEBUG=1`` lifts the floor and the payload filter
(levels go back to what they were), so a client or protocol problem can be debugged at DEBUG.
Record bytes then reach the logs and the privacy guarantee no longer covers them; a WARNING says
so. Use it only on test data, never on a production stream. It exists because the alternative --
patching logging by hand to chase a broker issue -- is easier to leave on unnoticed than a named
switch that announces itself on every start. The secret filter is **not** lifted: the switch is
for reading the protocol, and no protocol problem needs the password in the log. Redacting was
chosen over refusing the switch when SASL credentials are set, because the secured clusters are
exactly where a login or authorization problem needs the client's DEBUG lines.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

#: The root of kafka-python's logger hierarchy (every client module logs below it).
CLIENT_LOGGER = "kafka"
#: Lowest level of the client's records that may ever reach a handler (the floor at DEBUG).
CLIENT_FLOOR = logging.INFO
#: The floor when the run logs at INFO or above: the client's INFO lines are connection chatter.
QUIET_FLOOR = logging.WARNING
#: Set to ``1`` to leave the client's loggers unguarded (unsafe: raw record bytes in DEBUG logs).
UNSAFE_ENV = "STREAM_VIPS_UNSAFE_CLIENT_DEBUG"

#: Key names whose values are secrets (matched case-insensitively against one key name): names
#: containing password, secret, token or credential, and ``key`` or ``*_key`` (``api_key``); a
#: count "per key" (``max_records_per_key``) is not a key, and a name ending in ``_file``
#: (``sasl_password_file``) holds the path of a secret, not the secret. Their values are never
#: printed: not by ``stream-vips config``, not in a configuration error, not in a client's log line.
SECRET_KEY = re.compile(r"^(?!.*_file$).*(password|secret|token|credential|(^|(?<!_per)_)key$)", re.IGNORECASE)

REDACTED = "<redacted>"

log = logging.getLogger("stream_vips.logsafety")

#: Levels this module replaced, logger name -> previous level (restored by the opt-out).
_previous_levels: dict[str, int] = {}
#: The floor the payload filter enforces (set by :func:`guard_client_logging`).
_floor = QUIET_FLOOR
_warned_unsafe = False
#: Credentials resolved by the connectors (:func:`register_secret`), redacted wherever they appear.
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def is_secret(key: str) -> bool:
    """Whether a value under the key name ``key`` is a secret (:data:`SECRET_KEY`).

    >>> is_secret("sasl_password"), is_secret("api_key"), is_secret("max_records_per_key")
    (True, True, False)
    >>> is_secret("sasl_password_file"), is_secret("ssl_keyfile")
    (False, False)
    """
    return bool(SECRET_KEY.match(key))


def register_secret(value: str | None) -> None:
    """Have the client's log lines redact ``value`` wherever it appears (a resolved password).
    Values shorter than 4 characters are not registered: redacting them would mangle ordinary
    text, and no broker accepts such a password for long."""
    if value and len(value) >= 4:
        with _secrets_lock:
            _secrets.add(value)


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


def _apply(record: logging.LogRecord, redact: Any) -> None:
    """Run ``redact`` over a record's message and arguments."""
    record.msg = redact(record.msg)
    if isinstance(record.args, Mapping):
        record.args = {k: redact(v) for k, v in record.args.items()}
    elif record.args:
        record.args = tuple(redact(a) for a in record.args)


class ClientPayloadFilter(logging.Filter):
    """Drops client log records below the floor and redacts payload-carrying arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < _floor:
            return False
        _apply(record, _redact)
        return True


def _hide_keys(value: Any, depth: int = 4) -> Any:
    """``value`` with the values of secret-named keys replaced, in dicts ``depth`` levels deep."""
    if depth > 0 and isinstance(value, dict):
        return {k: REDACTED if isinstance(k, str) and is_secret(k) and v is not None else _hide_keys(v, depth - 1)
                for k, v in value.items()}
    if depth > 0 and isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_hide_keys(v, depth - 1) for v in value)
    return value


class ClientSecretFilter(logging.Filter):
    """Redacts credentials in client log records, at every level and with the unsafe switch too:
    values of secret-named keys in dict arguments, then every registered secret in the formatted
    message (which covers a secret inside any object's repr)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, Mapping):  # a lone dict argument (logging unpacks it)
            record.args = _hide_keys(dict(record.args))
        elif record.args:
            record.args = tuple(_hide_keys(a) for a in record.args)
        with _secrets_lock:
            secrets = sorted(_secrets, key=len, reverse=True)
        if secrets:
            try:
                text = record.getMessage()
            except Exception:  # a broken format string: leave it to the handler to report
                return True
            if any(s in text for s in secrets):
                for s in secrets:
                    text = text.replace(s, REDACTED)
                record.msg, record.args = text, None
        return True


def _client_loggers() -> list[logging.Logger]:
    """The ``kafka`` logger and every ``kafka.*`` logger created so far."""
    names = [n for n in list(logging.root.manager.loggerDict) if n.startswith(CLIENT_LOGGER + ".")]
    return [logging.getLogger(CLIENT_LOGGER)] + [logging.getLogger(n) for n in sorted(names)]


def unsafe_client_debug(env: Mapping[str, str] | None = None) -> bool:
    """True when ``STREAM_VIPS_UNSAFE_CLIENT_DEBUG=1`` asks for unguarded client logging."""
    return (os.environ if env is None else env).get(UNSAFE_ENV, "").strip() == "1"


def client_floor() -> int:
    """The client loggers' floor for the current run: INFO when the root logger is at DEBUG,
    else WARNING."""
    return CLIENT_FLOOR if logging.getLogger().getEffectiveLevel() <= logging.DEBUG else QUIET_FLOOR


def _set_level(logger: logging.Logger, level: int) -> None:
    _previous_levels.setdefault(logger.name, logger.level)
    logger.setLevel(level)


def _ensure_filter(logger: logging.Logger, cls: type[logging.Filter]) -> None:
    if not any(isinstance(f, cls) for f in logger.filters):
        logger.addFilter(cls())


def guard_client_logging(env: Mapping[str, str] | None = None) -> bool:
    """Apply the floor and the filters to the Kafka client's loggers; returns True when guarded.

    Idempotent and cheap: the CLI calls it after configuring logging (so the floor follows the
    run's level) and :func:`connectors.connector_class` calls it whenever a Kafka connector is
    looked up, so library users are covered too. With the unsafe opt-out set it removes the
    floor and the payload filter an earlier call installed (the secret filter stays), logs a
    WARNING and returns False.
    """
    global _floor, _warned_unsafe
    try:
        import kafka  # noqa: F401  -- creates the client's loggers so the filters reach all of them
    except ImportError:
        pass
    loggers = _client_loggers()
    if unsafe_client_debug(env):
        for logger in loggers:
            for f in [f for f in logger.filters if isinstance(f, ClientPayloadFilter)]:
                logger.removeFilter(f)
            _ensure_filter(logger, ClientSecretFilter)
            if logger.name in _previous_levels:
                logger.setLevel(_previous_levels.pop(logger.name))
        if not _warned_unsafe:
            log.warning("%s=1: the Kafka client's loggers are not guarded; at DEBUG they write raw record "
                        "bytes, which the privacy guarantee does not cover (test data only); credentials "
                        "stay redacted", UNSAFE_ENV)
            _warned_unsafe = True
        return False
    _warned_unsafe = False
    _floor = client_floor()
    for logger in loggers:
        if logger.name == CLIENT_LOGGER:  # the floor, unless a level above WARNING was chosen
            if logger.level <= QUIET_FLOOR and logger.level != _floor:
                _set_level(logger, _floor)
        elif 0 < logger.level < _floor:
            _set_level(logger, _floor)
        _ensure_filter(logger, ClientPayloadFilter)  # first: drops what is below the floor cheaply
        _ensure_filter(logger, ClientSecretFilter)
    return True
