"""Who may do what: the ACLs each Kafka connector needs (:class:`Grant`), checked at start against
the broker, and the broker's refusals turned into :class:`KafkaAccessDenied` naming what to grant.

Every connector declares its grants in one place, a ``grants(...)`` static method taking the
connector's own settings (:func:`connector_grants` calls it with a configuration section's
options); docs/deploy.md's table and ``k8s/base/kafka/users.yaml`` are held to these declarations
by tests. At start a connector checks them (:func:`check_grants`): a SASL login first
(:func:`authenticate`), then the operations the broker says the principal may perform on each
topic (``authorized_operations`` of a metadata request) and whether it may find its consumer
group. A transactional id cannot be asked about ahead; its refusal comes from the producer's
first transaction call and is named by :func:`denial` like every other refusal of either client
library.
"""

from __future__ import annotations

import inspect
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from connectors.kafka.connection import log, principal, server_list
from connectors.kafka.errors import KafkaAccessDenied

#: Kafka error codes (the protocol's, shared by both client libraries).
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNKNOWN_TOPIC_OR_PARTITION = 3
SASL_AUTHENTICATION_FAILED = 58
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
#: How long a start-up check waits for a group coordinator that is being created.
COORDINATOR_WAIT_S = 10.0


@dataclass(frozen=True)
class Grant:
    """One ACL a connector needs: ``operation`` (a Kafka ACL operation: Read, Write, Describe,
    DescribeConfigs, Create) on a resource, ``why`` in words and ``code``, the code path that needs it."""

    resource_type: Literal["topic", "group", "transactionalId"]
    name: str
    operation: str
    why: str
    code: str = ""
    pattern: Literal["literal", "prefix"] = "literal"

    @property
    def resource(self) -> str:
        """How a refusal names the resource, e.g. ``topic 'stream-vips.models'``."""
        prefix = " prefix" if self.pattern == "prefix" else ""
        return f"{self.resource_type}{prefix} {self.name!r}"


def grant_for(grants: Iterable[Grant], resource_type: str, operation: str) -> Grant:
    """The one grant of ``grants`` for ``operation`` on a resource of ``resource_type``."""
    return next(g for g in grants if g.resource_type == resource_type and g.operation == operation)


def discard_producer(producer: Any) -> None:
    """Close a producer the broker refused (a refused transactional id leaves librdkafka's producer
    in a fatal state in which even the flush on close fails: that failure says nothing new)."""
    try:
        producer.close(0)
    except Exception as exc:
        log.debug("closing a refused producer: %s", exc)


def connector_grants(cls: type, options: Mapping[str, Any]) -> list[Grant]:
    """What a connector class configured with ``options`` needs: ``cls.grants`` called with the
    options it takes, the constructor's defaults for the rest."""
    defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()}
    wanted = inspect.signature(cls.grants).parameters
    return cls.grants(**{name: options.get(name, defaults.get(name)) for name in wanted})


def not_authorized(who: str, operations: Sequence[str], resource: str, why: str) -> KafkaAccessDenied:
    """The refusal of ``operations`` on ``resource`` to principal ``who``, naming the grant."""
    ops = ", ".join(operations)
    return KafkaAccessDenied(f"not authorized: {who} needs {ops} on {resource} ({why}); add it to the "
                             "user's ACLs (docs/deploy.md, Access)",
                             principal=who, operations=operations, resource=resource)


def _because(grants: Sequence[Grant]) -> str:
    """Why ``grants`` are needed, with their code paths."""
    return "; ".join(dict.fromkeys(f"{g.why}, in {g.code}" if g.code else g.why for g in grants))


def authentication_failed(security: Mapping[str, Any], servers: Sequence[str], reason: str) -> KafkaAccessDenied:
    """A failed SASL login, naming the user and mechanism (never the password)."""
    user = security.get("sasl_plain_username")
    mechanism = security.get("sasl_mechanism")
    reason = re.sub(r"^.*SASL authentication error: ", "", " ".join(reason.split()))
    reason = re.sub(r" \(after \d+ms in state \w+\)$", "", reason)
    return KafkaAccessDenied(f"authentication failed for user {user} (mechanism {mechanism}) at "
                             f"{','.join(servers)}: {reason}; check the user name and the password "
                             "(sasl_password, sasl_password_file or STREAM_VIPS_KAFKA_SASL_PASSWORD[_FILE])",
                             principal=f"User:{user}", resource=",".join(servers))


# -- authentication ------------------------------------------------------------------------------

_authenticated: set[tuple] = set()
_authenticated_lock = threading.Lock()


def authenticate(servers: str | Sequence[str], security: Mapping[str, Any], timeout_s: float = 10.0) -> None:
    """Log in once with the SASL ``security`` settings and raise :func:`authentication_failed`
    when the broker refuses the credentials. kafka-python only logs a failed login and then
    reports that it could not bootstrap, as for a broker that is down; librdkafka reports it as an
    error event, so a throwaway confluent-kafka client asks. A success is remembered for the
    process; no SASL, or no answer at all (the broker down), returns quietly: the caller's own
    client then says what it finds."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    from connectors.kafka.confluent import LIBRDKAFKA_LOGGER, SECURITY_NAMES

    if not str(security.get("security_protocol", "")).startswith("SASL"):
        return
    servers = server_list(servers)
    key = (tuple(servers), tuple(sorted((k, str(v)) for k, v in security.items() if k in SECURITY_NAMES)))
    with _authenticated_lock:
        if key in _authenticated:
            return
    errors: list[KafkaError] = []
    conf = {"bootstrap.servers": ",".join(servers), "client.id": "stream-vips-login-check",
            "logger": LIBRDKAFKA_LOGGER, "log_level": 0, "error_cb": errors.append,
            **{SECURITY_NAMES[k]: v for k, v in security.items() if k in SECURITY_NAMES}}
    probe = Producer(conf)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            probe.list_topics(timeout=0.3)
        except KafkaException:
            probe.poll(0)  # serves error_cb
            codes = [e.code() for e in errors]
            if KafkaError._AUTHENTICATION in codes:
                # the cause is the broker's error (its text is in the message), not the metadata call's timeout
                raise authentication_failed(security, servers,
                                            errors[codes.index(KafkaError._AUTHENTICATION)].str()) from None
            if KafkaError._ALL_BROKERS_DOWN in codes:
                return
            continue
        with _authenticated_lock:
            _authenticated.add(key)
        return


# -- checks at start -----------------------------------------------------------------------------

def _op_name(operation: str) -> str:
    """kafka-python's name of an ACL operation (``DescribeConfigs`` -> ``DESCRIBE_CONFIGS``)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).upper()


def open_admin(servers: str | Sequence[str], security: Mapping[str, Any], **options: Any) -> Any:
    """A kafka-python admin client, after :func:`authenticate` (a refused login is named)."""
    from kafka import KafkaAdminClient

    authenticate(servers, security)
    return KafkaAdminClient(bootstrap_servers=server_list(servers), **dict(security), **options)


def check_grants(admin: Any, security: Mapping[str, Any], grants: Iterable[Grant]) -> None:
    """Raise :class:`KafkaAccessDenied` for the first resource on which the broker does not allow
    every operation ``grants`` name, listing the missing ones.

    Topics: the operations the broker reports as authorized for this principal (a topic it may
    not even describe lacks them all; one that does not exist is left to the caller, as is
    ``Create``). Groups: finding the group's coordinator needs Describe, and Read is checked when
    the group exists (a new group reports no operations). Transactional ids are checked by their
    first use (:func:`denial`). Brokers too old to report operations are not second-guessed.
    """
    from kafka.errors import GroupAuthorizationFailedError

    who = principal(security)
    grants = [g for g in grants if g.operation != "Create"]
    by_resource: dict[tuple[str, str], list[Grant]] = {}
    for g in grants:
        by_resource.setdefault((g.resource_type, g.name), []).append(g)
    topics = [name for rtype, name in by_resource if rtype == "topic"]
    described = {t["name"]: t for t in admin.describe_topics(topics)} if topics else {}
    for (rtype, name), needed in by_resource.items():
        if rtype == "topic":
            found = described.get(name, {})
            if found.get("error_code") == TOPIC_AUTHORIZATION_FAILED:
                raise _undescribable(who, needed)
            if found.get("error_code") != 0 or found.get("authorized_operations") is None:
                continue  # missing (the caller decides), or a broker too old to say
            allowed = set(found["authorized_operations"])
        elif rtype == "group":
            try:
                allowed = _group_operations(admin, name)
            except GroupAuthorizationFailedError:
                allowed = set()
            if allowed is None:
                continue
        else:
            continue
        missing = [g for g in needed if _op_name(g.operation) not in allowed]
        if missing:
            raise not_authorized(who, [g.operation for g in missing], missing[0].resource, _because(missing))


#: The operations that imply Describe (Kafka's ACL rules): a principal granted none of them on a
#: topic may not even describe it, and the broker then reports no operations at all.
IMPLY_DESCRIBE = ("Read", "Write", "Delete", "Alter", "Describe")


def _undescribable(who: str, needed: Sequence[Grant]) -> KafkaAccessDenied:
    """The refusal for a topic the principal may not describe: of the operations needed, those
    that imply Describe are all missing (any one of them would allow it); the others cannot be
    judged then. Needing none of them, it lacks Describe itself."""
    missing = [g for g in needed if g.operation in IMPLY_DESCRIBE]
    if missing:
        return not_authorized(who, [g.operation for g in missing], missing[0].resource, _because(missing))
    return not_authorized(who, ["Describe"], needed[0].resource, _because(needed))


def _group_operations(admin: Any, group: str) -> set[str] | None:
    """The operations allowed on ``group``; ``None`` when the group does not exist yet (Describe
    is then known to be allowed: its coordinator was found)."""
    from kafka.errors import CoordinatorLoadInProgressError, CoordinatorNotAvailableError, NotCoordinatorError

    deadline = time.monotonic() + COORDINATOR_WAIT_S
    while True:
        try:
            found = admin.describe_groups([group])[group]
            break
        except (CoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    ops = found.get("authorized_operations")
    return None if ops is None else set(ops)


def check_access(servers: str | Sequence[str], security: Mapping[str, Any], grants: Sequence[Grant],
                 **options: Any) -> None:
    """:func:`check_grants` with an admin client of its own (``options``: kafka-python admin settings)."""
    admin = open_admin(servers, security, **options)
    try:
        check_grants(admin, security, grants)
    finally:
        admin.close()


# -- refusals of either client library -----------------------------------------------------------

def _code(exc: BaseException) -> int | None:
    """The Kafka error code behind ``exc``: kafka-python's ``errno``, confluent-kafka's ``code()``."""
    from confluent_kafka import KafkaError
    from kafka.errors import KafkaError as KafkaPythonError

    if isinstance(exc, KafkaPythonError):
        return getattr(exc, "errno", None)
    error = exc.args[0] if exc.args else None
    return error.code() if isinstance(error, KafkaError) else None


#: The resource type an authorization error code is about.
_REFUSED_RESOURCE = {TOPIC_AUTHORIZATION_FAILED: "topic", GROUP_AUTHORIZATION_FAILED: "group",
                     TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactionalId", CLUSTER_AUTHORIZATION_FAILED: "cluster"}
#: What the connectors do with a group or a transactional id needs this one operation.
_ONLY_OPERATION = {"group": "Read", "transactionalId": "Write"}


def denial(exc: BaseException | None, security: Mapping[str, Any], grant: Grant | None = None,
           servers: Sequence[str] = ()) -> KafkaAccessDenied | None:
    """``exc`` (or an exception in its cause chain) as :class:`KafkaAccessDenied` when it is the
    broker refusing a login or an operation, else ``None``. ``grant`` names what the failed call
    needed; without it the resource is read from the error (kafka-python names the topics or the
    group) and the operation is named where the connectors use only one (Read on a group, Write on
    a transactional id)."""
    from confluent_kafka import KafkaError

    while exc is not None:
        if isinstance(exc, KafkaAccessDenied):
            return exc
        code = _code(exc)
        if code in (SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION):
            return authentication_failed(security, servers, str(exc))
        kind = _REFUSED_RESOURCE.get(code)
        if kind is not None:
            who = principal(security)
            if grant is not None and grant.resource_type == kind:
                return not_authorized(who, [grant.operation], grant.resource, _because([grant]))
            names = [a for a in exc.args if isinstance(a, str)] + [n for a in exc.args if isinstance(a, (set, list))
                                                                   for n in a]
            resource = f"{kind} {sorted(names)[0]!r}" if names and kind != "cluster" else kind
            operation = _ONLY_OPERATION.get(kind)
            return KafkaAccessDenied(
                f"not authorized: the broker refused {who} {operation or 'an operation'} on {resource} "
                f"({type(exc).__name__}); compare the user's ACLs with docs/deploy.md, Access",
                principal=who, operations=[operation] if operation else [], resource=resource)
        exc = exc.__cause__ or exc.__context__
    return None
