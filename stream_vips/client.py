"""The read side: the latest published model per id, as a posterior with predictive methods.

:class:`ModelReader` reads the model topic with ``isolation_level=read_committed`` (so chunks of
an aborted or unfinished message are never seen), reassembles chunked messages, validates each
message against the schema (refusing a schema version it does not know) and keeps the latest
version per model id. :meth:`ModelReader.posterior` rebuilds the family's model from the
published hyperparameters and natural parameters: its own predictive methods (``predictive``
for ``linreg``, ``predict_proba`` for ``logistic``, ``held_out_perplexity`` for ``lda``) then answer.
:class:`RiverClassifier` and :class:`RiverRegressor` wrap a published model for ``river``
(``predict_proba_one`` / ``predict_one``; ``learn_one`` picks up newer published versions, since
learning happens in the private pipeline).

Everything here is post-processing of privatized releases (privacy rule 8 in docs/privacy.md):
reading costs no privacy budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from river import base as river_base

from stream_vips import messages
from stream_vips.errors import StreamVipsError
from stream_vips.models.posterior import PublishedModel, SchemaVersionError, check_message, posterior_from_message

__all__ = ["ModelReader", "PublishedModel", "RiverClassifier", "RiverRegressor", "SchemaVersionError", "check_message",
           "posterior_from_message"]

log = logging.getLogger("stream_vips.client")


class ModelReader:
    """Follows a model topic and keeps the latest valid message per model id.

    ``poll()`` reads what has arrived (``until_end=True``: everything up to the current end);
    ``latest()`` / ``posterior(model_id)`` answer from what was read. A message is valid when it
    follows the schema, backs any privacy claim and rebuilds into its family's model (arrays that
    decode to the family's shapes, finite values, a known family, valid hyperparameters). Invalid
    messages are counted in :attr:`invalid` with a one-line reason, logged without their content
    and skipped, so the last valid version stays the latest; a schema version this code does not
    know raises :class:`SchemaVersionError` (upgrade the reader rather than misread a model).
    """

    def __init__(self, bootstrap_servers: str | Sequence[str], topic: str = "stream-vips-models",
                 security: Mapping[str, Any] | None = None, **security_options: Any) -> None:
        from kafka import KafkaConsumer

        from connectors.kafka import Reassembler
        from connectors.kafka import security_options as _security
        from connectors.kafka import server_list as _servers
        from connectors.kafka.access import authenticate, check_access

        self.topic = topic
        servers = _servers(bootstrap_servers)
        self._security = dict(security or _security(security_options))
        (self._reading,) = self.grants(topic)
        authenticate(servers, self._security)  # a refused login is named, not taken for a broker that is down
        self._consumer = KafkaConsumer(
            bootstrap_servers=servers, group_id=None, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest", **self._security)
        parts = self._consumer.partitions_for_topic(topic)
        if not parts:  # unknown to this principal: not authorized, or missing
            self._consumer.close()
            check_access(servers, self._security, [self._reading])
            raise ValueError(f"model topic {topic!r} does not exist")
        from kafka.structs import TopicPartition

        self._tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self._consumer.assign(self._tps)
        self._consumer.seek_to_beginning(*self._tps)
        self._reassembler = Reassembler()
        self._latest: dict[str, dict[str, Any]] = {}
        self.invalid: list[tuple[str, str]] = []

    @staticmethod
    def grants(topic: str = "stream-vips-models") -> list[Any]:
        """The ACL a reader needs (:class:`connectors.kafka.Grant`): Read on the model topic, no group."""
        from connectors.kafka import Grant

        return [Grant("topic", topic, "Read", "the model reader reads every model message",
                      "stream_vips.client.ModelReader.poll, used by stream-vips inspect")]

    def poll(self, timeout_s: float = 1.0, until_end: bool = True) -> int:
        """Read new messages; returns how many complete messages were read. A missing Read ACL
        raises :class:`~connectors.kafka.KafkaAccessDenied`."""
        from connectors.kafka.access import denial

        try:
            return self._poll(timeout_s, until_end)
        except Exception as exc:
            denied = denial(exc, self._security, self._reading)
            if denied is None:
                raise
            raise denied from None

    def _poll(self, timeout_s: float, until_end: bool) -> int:
        n = 0
        deadline = time.monotonic() + timeout_s
        ends = self._consumer.end_offsets(self._tps) if until_end else {}
        while True:
            for recs in self._consumer.poll(timeout_ms=max(1, int(min(0.5, timeout_s) * 1000))).values():
                for rec in recs:
                    n += self._handle(rec)
            done = until_end and all(self._consumer.position(tp) >= ends[tp] for tp in self._tps)
            if done or time.monotonic() >= deadline:
                return n

    def _handle(self, rec: Any) -> int:
        whole = self._reassembler.add(rec.key, rec.value, rec.headers)
        if whole is None:
            return 0
        key, payload = whole
        try:
            msg = check_message(messages.loads(payload, validate=False))
            posterior_from_message(msg)  # a message that does not rebuild is no model to serve
        except SchemaVersionError:
            raise
        except (ValueError, TypeError, StreamVipsError) as exc:  # MessageError, ConfigError included
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            self.invalid.append((key, reason))
            log.warning("skipped invalid model message (key %r): %s", key, reason)
            return 0
        current = self._latest.get(msg["model_id"])
        if current is None or msg["version"] >= current["version"]:
            self._latest[msg["model_id"]] = msg
        return 1

    def latest(self) -> dict[str, dict[str, Any]]:
        """``{model_id: latest message}`` read so far."""
        return dict(self._latest)

    def posterior(self, model_id: str = "default", wait_s: float = 0.0) -> PublishedModel:
        """The latest published model ``model_id`` as a posterior object.

        When the reader has not seen ``model_id`` yet it reads to the end of the topic, and goes
        on reading for up to ``wait_s`` seconds until the model appears: a transaction's commit
        markers reach the partition shortly after the producer's commit returns, and only then
        does a ``read_committed`` reader see its messages.
        """
        deadline = time.monotonic() + wait_s
        if model_id not in self._latest:
            self.poll()
        while model_id not in self._latest and time.monotonic() < deadline:
            self.poll(timeout_s=min(0.5, max(0.0, deadline - time.monotonic())), until_end=False)
        if model_id not in self._latest:
            raise KeyError(f"no model {model_id!r} published on {self.topic!r} (known: {sorted(self._latest)})")
        return posterior_from_message(self._latest[model_id])

    def close(self) -> None:
        self._consumer.close(autocommit=False)

    def __enter__(self) -> ModelReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RiverWrapper:
    """Shared part of the river wrappers: feature order and refreshing from a reader."""

    def __init__(self, published: PublishedModel, features: Sequence[str], reader: ModelReader | None = None,
                 refresh_s: float = 5.0) -> None:
        self.published = published
        self.features = list(features)
        self.reader = reader
        self.refresh_s = float(refresh_s)
        self._checked = time.monotonic()

    def _row(self, x: Mapping[str, float]) -> np.ndarray:
        missing = [f for f in self.features if f not in x]
        if missing:
            raise KeyError(f"features missing from x: {missing}")
        return np.array([[float(x[f]) for f in self.features]])

    def learn_one(self, x: Mapping[str, float], y: Any = None) -> None:
        """No learning on raw data here (that would bypass the privacy wall): at most every
        ``refresh_s`` seconds, switch to a newer published version if the reader has one."""
        if self.reader is None or time.monotonic() - self._checked < self.refresh_s:
            return
        self._checked = time.monotonic()
        self.reader.poll(timeout_s=0.2)
        latest = self.reader.latest().get(self.published.model_id)
        if latest is not None and latest["version"] > self.published.version:
            self.published = posterior_from_message(latest)


class RiverClassifier(_RiverWrapper, river_base.Classifier):
    """A published binary classifier (a family with ``predict_proba``) as a river classifier.

    >>> issubclass(RiverClassifier, river_base.Classifier)
    True
    """

    def predict_proba_one(self, x: Mapping[str, float]) -> dict[bool, float]:
        p = float(self.published.model.predict_proba(self._row(x))[0])
        return {False: 1.0 - p, True: p}

    def predict_one(self, x: Mapping[str, float]) -> bool:
        proba = self.predict_proba_one(x)
        return proba[True] >= proba[False]


class RiverRegressor(_RiverWrapper, river_base.Regressor):
    """A published regression model (a family with ``predictive``) as a river regressor:
    ``predict_one`` is the posterior predictive mean."""

    def predict_one(self, x: Mapping[str, float]) -> float:
        mean, _ = self.published.model.predictive(self._row(x))
        return float(mean[0])
