"""A posterior rebuilt from a released model message (no I/O): the family's model with the
published hyperparameters and natural parameters, with its own predictive methods. Reading a
release is post-processing of privatized statistics (privacy rule 8 in docs/privacy.md): it costs
no privacy budget. :mod:`stream_vips.client` reads messages from the model topic with this."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_vips import messages
from stream_vips.models import model_class, summaries
from stream_vips.models.base import Model


class SchemaVersionError(messages.MessageError):
    """A model message with a schema version this reader does not understand."""


@dataclass(frozen=True)
class PublishedModel:
    """One published model: its message fields plus the rebuilt family model (the posterior)."""

    model_id: str
    version: int
    family: str
    privacy: Mapping[str, Any]
    message: Mapping[str, Any]
    model: Model

    @property
    def private(self) -> bool:
        """Whether the message carries a backed privacy guarantee (false for a non-private baseline;
        :func:`posterior_from_message` refuses a claim without noise, accountant or budget)."""
        return messages.is_private(self.message)

    @property
    def epsilon_spent(self) -> float:
        """epsilon of the releases behind this model; infinite for a non-private run (its message
        carries ``epsilon_spent: null`` and ``private: false``: no guarantee at all)."""
        value = self.privacy.get("epsilon_spent")
        return math.inf if value is None or not self.private else float(value)


def check_message(msg: Any) -> dict[str, Any]:
    """Schema-validate a decoded message, naming an unknown schema version explicitly."""
    if isinstance(msg, dict) and msg.get("schema_version") != messages.SCHEMA_VERSION:
        raise SchemaVersionError(
            f"model message schema_version {msg.get('schema_version')!r} is not supported "
            f"(this reader understands {messages.SCHEMA_VERSION})")
    return messages.validate_message(msg)


def posterior_from_message(msg: Mapping[str, Any]) -> PublishedModel:
    """Rebuild the family's model from a validated message (hyperparameters + natural parameters).

    Hyperparameters that are not constructor arguments (derived quantities a family reports,
    e.g. a noise scale) are skipped; the natural parameters restore the fitted state. A privacy
    claim the report does not back (no noise, no accountant, epsilon not finite or over budget)
    is refused with :class:`~stream_vips.messages.MessageError`, so no such model is presented
    as private; so are hyperparameters whose arrays cannot be allocated.
    """
    messages.check_privacy(msg["privacy"])
    cls = model_class(msg["family"])
    params = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in msg["hyperparameters"].items() if k in params and k != "self"}
    state = messages.decode_state(msg)
    _check_sizes(cls, msg["hyperparameters"], state)
    try:
        model = cls(**kwargs)
        model.load_state(state)
    except MemoryError:  # a last resort: sizes are checked against the arrays above
        raise messages.MessageError(
            f"the {msg['family']} hyperparameters ask for more memory than this reader has") from None
    return PublishedModel(msg["model_id"], int(msg["version"]), msg["family"], dict(msg["privacy"]), msg, model)


def summary_of(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The posterior summary of a message: its family's :meth:`~stream_vips.models.base.Model.summary`
    on the model rebuilt from the message's hyperparameters and natural parameters alone, so from
    released values only (post-processing, no privacy cost), in plain JSON numbers (NaN and
    infinity as null) with ``family`` and ``version``. A model that does not rebuild or a summary that
    fails gives a ``"none"`` kind naming why: the release it describes is paid for and still goes out."""
    try:
        body = summaries.plain(posterior_from_message(msg).model.summary())
    except Exception as exc:  # noqa: BLE001 - a summary that fails must not lose a paid release
        body = {"kind": "none", "predictive": "no summary: use the natural parameters",
                "notes": [f"the summary failed ({type(exc).__name__}: {exc})"]}
    return {"family": msg["family"], "version": int(msg["version"]), **body}


def with_summary(msg: Mapping[str, Any]) -> dict[str, Any]:
    """``msg`` with its ``summary`` block (:func:`summary_of`), validated; what a step publishes."""
    fields = {k: v for k, v in msg.items() if k != "summary"}
    return messages.validate_message({**fields, "summary": summary_of(fields)})


def _check_sizes(cls: type[Model], hyperparameters: Mapping[str, Any], state: Mapping[str, np.ndarray]) -> None:
    """Refuse hyperparameters that ask for more than the message's arrays hold, before the model
    is built: a message is bounded by the topic's size limit, while ``n_latent: 40000`` in a small
    sbn message made its constructor allocate 14 GB. Every array the message carries must have
    the shape the hyperparameters give, and they may not give more than twice the elements it
    carries (an older layout may lack an array, as sbn's ``wc_stat``)."""
    try:
        shapes = cls.state_shapes(hyperparameters)
    except (KeyError, TypeError) as exc:
        raise messages.MessageError(f"hyperparameters lack or mistype {exc}") from None
    extra = sorted(set(state) - set(shapes))
    if extra:
        raise messages.MessageError(f"natural parameters {extra} are not the family's")
    carried = sum(arr.size for arr in state.values())
    missing = 0  # elements of the arrays the message lacks (a varying length counts 0)
    for name, shape in shapes.items():
        arr = state.get(name)
        if arr is None:
            missing += math.prod(n or 0 for n in shape)
        elif arr.ndim != len(shape) or any(n is not None and n != m for n, m in zip(shape, arr.shape)):
            raise messages.MessageError(f"natural parameter {name!r} has shape {list(arr.shape)}, but the "
                                        f"hyperparameters give {[n if n is not None else '*' for n in shape]}")
    if missing > carried + 64:
        raise messages.MessageError(f"the hyperparameters give {carried + missing} natural parameters, the "
                                    f"message carries {carried}")
