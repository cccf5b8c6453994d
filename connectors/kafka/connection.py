"""How every Kafka connector connects: one :class:`KafkaConnection` (servers, security, reconnect
backoff, client ids); the errors the connectors raise are in :mod:`connectors.kafka.errors`.

Security settings (``security_protocol``, ``sasl_mechanism``, ``sasl_username``,
``sasl_password``, ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_keyfile_password``)
that are not given fall back to ``STREAM_VIPS_KAFKA_<NAME>`` environment variables (so secrets
need not live in the YAML file). The two secrets may also be files, e.g. a mounted Kubernetes
Secret: ``sasl_password_file`` / ``ssl_keyfile_password_file`` (or ``STREAM_VIPS_KAFKA_SASL_PASSWORD_FILE``
...) name a file whose content (without a trailing newline) is read once, when the connection is
resolved; a missing, unreadable or empty file is a :class:`~stream_vips.errors.ConfigError`
naming the key, the content is never logged (:func:`stream_vips.logsafety.register_secret`), and
``stream-vips config`` shows the path. A value and a file for the same secret are refused.
Every long-lived client reconnects with at most ``reconnect_backoff_max_ms`` (default 1 s, the
Java client's default; kafka-python's own 30 s would stall recovery for half a minute after a
broker restart).

``client`` picks the client library behind every connector of the connection: ``kafka-python``
(the default) or ``confluent`` (confluent-kafka on librdkafka, about three times faster at
reading in benchmarks/bench_kafka.py; :mod:`connectors.kafka.confluent`). Both give the same guarantees; topic
administration and reading a whole topic back (ledger replay, ``Sink.latest``) use kafka-python in either case.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from connectors.kafka.errors import KafkaConnectorError
from stream_vips.errors import ConfigError
from stream_vips.logsafety import guard_client_logging, register_secret

#: One logger for the whole package: log lines keep the name ``connectors.kafka``.
log = logging.getLogger(__package__)
guard_client_logging()  # the client logs record bytes at DEBUG; every user of these connectors is guarded

SECURITY_KEYS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password",
                 "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_keyfile_password")
#: The secret settings, each of which may instead name a file: ``<key>_file``.
SECRET_KEYS = ("sasl_password", "ssl_keyfile_password")
FILE_KEYS = tuple(f"{key}_file" for key in SECRET_KEYS)
#: Our names -> kafka-python's, where they differ.
_KAFKA_PYTHON_NAMES = {"sasl_username": "sasl_plain_username", "sasl_password": "sasl_plain_password",
                       "ssl_keyfile_password": "ssl_password"}
ENV_PREFIX = "STREAM_VIPS_KAFKA_"
#: The client libraries a connection can use (``KafkaConnection.client``).
ClientName = Literal["kafka-python", "confluent"]
CLIENTS: tuple[str, ...] = typing.get_args(ClientName)


def _secret_from_file(path: str, where: str) -> str:
    """The content of the secret file ``path`` (one trailing newline dropped); ConfigError naming ``where``."""
    try:
        value = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: {path} is not UTF-8 text") from None
    value = value[:-1] if value.endswith("\n") else value
    value = value[:-1] if value.endswith("\r") else value
    if not value:
        raise ConfigError(f"{where}: {path} is empty")
    return value


def _setting(key: str, given: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    """``key``'s value from the options, else the environment; a secret also from its ``_file``."""
    for source, name_of in ((given, lambda k: k), (env, lambda k: ENV_PREFIX + k.upper())):
        value = source.get(name_of(key))
        path = source.get(name_of(f"{key}_file")) if key in SECRET_KEYS else None
        if value is not None and path is not None:
            raise ConfigError(f"{name_of(key)} and {name_of(key + '_file')}: give the secret or its file, not both")
        if path is not None:
            return _secret_from_file(str(path), name_of(f"{key}_file"))
        if value is not None:
            return value
    return None


def security_options(options: Mapping[str, Any] | None = None,
                     env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """kafka-python keyword arguments for the security settings (options, else environment; the
    secrets also from files). Resolved secrets are registered for redaction in the client's logs."""
    env = os.environ if env is None else env
    given = dict(options or {})
    out: dict[str, Any] = {}
    for key in SECURITY_KEYS:
        value = _setting(key, given, env)
        if value is None:
            continue
        if key in SECRET_KEYS:
            register_secret(str(value))
        out[_KAFKA_PYTHON_NAMES.get(key, key)] = value
    protocol = out.setdefault("security_protocol", "PLAINTEXT")
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise KafkaConnectorError(
            f"security_protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, got {protocol!r}")
    if protocol.startswith("SASL"):
        if "sasl_mechanism" not in out:
            raise KafkaConnectorError(f"security_protocol {protocol} needs sasl_mechanism (e.g. PLAIN, SCRAM-SHA-512)")
        if out["sasl_mechanism"] in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
                out.get("sasl_plain_username") and out.get("sasl_plain_password")):
            raise KafkaConnectorError(
                f"sasl_mechanism {out['sasl_mechanism']} needs sasl_username and sasl_password or "
                f"sasl_password_file (options or {ENV_PREFIX}SASL_USERNAME / {ENV_PREFIX}SASL_PASSWORD / "
                f"{ENV_PREFIX}SASL_PASSWORD_FILE)")
    return out


def principal(security: Mapping[str, Any]) -> str:
    """The principal the broker sees for kafka-python ``security`` settings (the ACLs name it).

    >>> principal({"security_protocol": "SASL_SSL", "sasl_plain_username": "stream-vips"})
    'User:stream-vips'
    >>> principal({})
    'User:ANONYMOUS'
    """
    protocol = security.get("security_protocol", "PLAINTEXT")
    if protocol.startswith("SASL") and security.get("sasl_plain_username"):
        return f"User:{security['sasl_plain_username']}"
    if protocol == "SSL" and security.get("ssl_certfile"):
        return f"the client certificate's principal ({security['ssl_certfile']})"
    return "User:ANONYMOUS"


def server_list(bootstrap_servers: str | Sequence[str]) -> list[str]:
    """The ``host:port`` entries of a ``bootstrap_servers`` setting (a comma-separated string, or
    a list of them); :class:`KafkaConnectorError` when there are none.

    >>> server_list(" a:1, b:2"), server_list(["a:1,b:2", "c:3"])
    (['a:1', 'b:2'], ['a:1', 'b:2', 'c:3'])
    """
    servers = [bootstrap_servers] if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
    servers = [s.strip() for part in servers for s in part.split(",") if s.strip()]
    if not servers:
        raise KafkaConnectorError("bootstrap_servers is empty")
    return servers


@dataclass(frozen=True)
class KafkaConnection:
    """Where and how a process's Kafka clients connect, shared by its connectors.

    Resolved once, when built: unset security settings are read from the environment and
    checked (:func:`security_options`), so :attr:`servers` and :attr:`security` are what every
    client gets. A connector's client id is ``<client_id_prefix>-<role>`` unless it is given one.
    """

    bootstrap_servers: str | list[str]
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_keyfile_password: str | None = field(default=None, repr=False)
    sasl_password_file: str | None = None
    ssl_keyfile_password_file: str | None = None
    reconnect_backoff_max_ms: int = 1000
    client_id_prefix: str = "stream-vips"
    client: ClientName = "kafka-python"
    #: kafka-python's security keyword arguments (environment fallbacks applied).
    security: dict[str, Any] = field(init=False, repr=False, compare=False)
    #: The bootstrap servers as a list of ``host:port``.
    servers: list[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise KafkaConnectorError(f"client must be kafka-python or confluent, got {self.client!r}")
        security = security_options({k: getattr(self, k) for k in (*SECURITY_KEYS, *FILE_KEYS)})
        object.__setattr__(self, "security", security)
        object.__setattr__(self, "servers", server_list(self.bootstrap_servers))

    @property
    def principal(self) -> str:
        """The principal the broker sees for this connection (:func:`principal`)."""
        return principal(self.security)

    def client_id(self, role: str) -> str:
        """The client id of a connector's client with this ``role`` (e.g. ``source``)."""
        return f"{self.client_id_prefix}-{role}"

    def client_options(self, client_id: str) -> dict[str, Any]:
        """kafka-python keyword arguments for a connector's long-lived client named ``client_id``."""
        return {"bootstrap_servers": self.servers, "client_id": client_id,
                "reconnect_backoff_max_ms": self.reconnect_backoff_max_ms, **self.security}


#: Connection settings a connector takes as flat arguments after its own ones.
_TRAILING = ("reconnect_backoff_max_ms", *SECURITY_KEYS, *FILE_KEYS, "client")


def takes_connection(init: Callable[..., None]) -> Callable[..., None]:
    """Let a connector's ``__init__(self, ..., *, connection)`` also take the connection settings
    as flat arguments, where they stood before :class:`KafkaConnection` existed:
    ``bootstrap_servers`` first, ``reconnect_backoff_max_ms``, the security settings and
    ``client`` last.

    Configuration files use the flat names and ``stream_vips.config`` checks them against the
    constructor's signature, so the wrapper publishes that signature with its annotations.
    ``bootstrap_servers`` stays required there (a configuration file cannot hold a connection
    object); a call may leave it out only when it gives ``connection``. Flat settings and a
    ``connection`` are not mixed.
    """
    defaults = {f.name: inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(KafkaConnection)}
    hints = typing.get_type_hints(KafkaConnection)
    own = [p for p in inspect.signature(init).parameters.values() if p.name != "connection"]
    flat = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=defaults[name],
                              annotation=hints[name]) for name in ("bootstrap_servers", *_TRAILING)]
    connection = inspect.Parameter("connection", inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=KafkaConnection | None)
    signature = inspect.Signature([own[0], flat[0], *own[1:], *flat[1:], connection], return_annotation=None)

    @functools.wraps(init)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        arguments = signature.bind_partial(*args, **kwargs).arguments
        given = {p.name: arguments.pop(p.name) for p in flat if p.name in arguments}
        chosen = arguments.pop("connection", None)
        if chosen is None:
            chosen = KafkaConnection(**given)
        elif given:
            raise KafkaConnectorError(f"give either connection or {', '.join(given)}, not both")
        init(**arguments, connection=chosen)

    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    wrapper.__annotations__ = {**init.__annotations__, **{p.name: p.annotation for p in flat},
                               "connection": connection.annotation}
    return wrapper
