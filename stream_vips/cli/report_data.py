"""What ``stream-vips report`` shows, read and computed once: the ledger, the published models and
the dead letters (from files or Kafka topics, without locking or fencing anything), the epsilon
curve recomputed from the ledger's events, the mechanism per step, the latest model's predictive
summary, and the :class:`Report` that holds them with its warnings. Drawing and writing them is
:mod:`stream_vips.cli.report_page`; the command is :mod:`stream_vips.cli.report`.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from stream_vips.errors import StreamVipsError

#: Default number of step counts the epsilon curve is evaluated at.
DEFAULT_POINTS = 200


class ReportError(StreamVipsError, ValueError):
    """Input the report cannot use (exit code 2); the message says which and why."""


# ---------------------------------------------------------------------------------------------
# inputs


@dataclass
class LedgerView:
    """A ledger read without locking it: its identity and events in order."""

    path: str
    genesis: dict[str, Any]
    events: list
    torn: bool = False

    @property
    def ledger_id(self) -> str:
        return str(self.genesis["ledger_id"])


def read_ledger_topic(bootstrap: str, topic: str, name: str, timeout_s: float) -> LedgerView:
    """Kafka ledger ``name`` on ``topic``, read committed and without opening a writer (so the
    running pipeline is not fenced); :class:`ReportError` if it is empty or corrupt."""
    from connectors.kafka import read_ledger_topic as read_committed
    from connectors.kafka import security_options
    from stream_vips.cli.inspect import deadline_options, within
    from stream_vips.privacy.ledger import LedgerCorrupt

    where = f"ledger topic {topic!r} name {name!r}"
    security = {**security_options(), **deadline_options(timeout_s)}
    try:
        genesis, events, *_ = within(timeout_s * 2, lambda: read_committed(
            bootstrap, topic, name, security=security, timeout_s=timeout_s), f"reading the {where}")
    except LedgerCorrupt as exc:
        raise ReportError(str(exc)) from None
    if genesis is None:
        raise ReportError(f"the {where} has no steps")
    return LedgerView(f"topic {topic!r} name {name!r}", genesis, events)


def read_ledger(path: str | os.PathLike[str]) -> LedgerView:
    """The ledger at ``path``, read-only (``FileLedger`` would lock it and could write a genesis);
    :class:`ReportError` if it cannot be read, is empty or is corrupt."""
    from stream_vips.privacy.ledger import LedgerCorrupt, replay_lines

    torn = []

    def complete_lines(fh: Any) -> Iterable[bytes]:
        for line in fh:
            if not line.endswith(b"\n"):
                torn.append(True)  # a write cut by a crash: its append never returned
                return
            yield line[:-1]

    try:
        with open(path, "rb") as fh:
            genesis, events, *_ = replay_lines(complete_lines(fh), f"ledger {path}")
    except OSError as exc:
        raise ReportError(f"cannot read the ledger {path}: {exc.strerror or exc}") from None
    except LedgerCorrupt as exc:
        raise ReportError(str(exc)) from None
    if genesis is None:
        raise ReportError(f"the ledger {path} is empty")
    return LedgerView(str(path), genesis, events, bool(torn))


@dataclass
class Models:
    """What the report needs of the published models of one id."""

    model_id: str
    latest: dict[str, Any]
    #: (steps = version + 1, created_at, epsilon_spent or None) of each message read, in order.
    history: list[tuple[int, datetime, float | None]] = field(default_factory=list)
    source: str = ""
    skipped: int = 0


def _point(msg: Mapping[str, Any]) -> tuple[int, datetime, float | None] | None:
    try:
        when = datetime.fromisoformat(str(msg["created_at"]))
        eps = msg["privacy"].get("epsilon_spent")
        return int(msg["version"]) + 1, when, None if eps is None else float(eps)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _choose_id(ids: Sequence[str], model_id: str | None, where: str) -> str | None:
    if model_id is not None:
        return model_id if model_id in ids else None
    if len(ids) > 1:
        raise ReportError(f"{where} holds several model ids ({', '.join(sorted(ids))}): choose one with --model-id")
    return ids[0] if ids else None


def models_from_file(path: str | os.PathLike[str], model_id: str | None) -> Models | None:
    """History and latest message of one id in a JSONL model file (None: no such model)."""
    import orjson

    from stream_vips.cli.inspect import latest_in_file

    history: dict[str, list] = {}
    try:
        with open(path, "rb") as fh:
            for line in fh:
                try:
                    msg = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # blank, torn or not JSON; the schema check below reports the latest
                if isinstance(msg, dict) and isinstance(msg.get("model_id"), str):
                    point = _point(msg)
                    if point is not None:
                        history.setdefault(msg["model_id"], []).append(point)
        chosen = _choose_id(list(history), model_id, f"the model file {path}")
        if chosen is None:
            return None
        latest, skipped = latest_in_file(path, chosen)
    except OSError as exc:
        raise ReportError(f"cannot read the model file {path}: {exc.strerror or exc}") from None
    if chosen not in latest:
        return None
    return Models(chosen, latest[chosen], history[chosen], f"model file {path}", len(skipped))


def models_from_topic(bootstrap: str, topic: str, model_id: str | None, timeout_s: float) -> Models | None:
    """History (what the topic still holds: it is compacted) and latest message of one id."""
    from stream_vips.cli.inspect import open_reader, read_topic_to_end
    from stream_vips.client import ModelReader

    class HistoryReader(ModelReader):
        """Also keeps a point per message that became the latest of its id."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.history: dict[str, list] = {}

        def _handle(self, rec: Any) -> int:
            before = self.latest()
            n = super()._handle(rec)
            for key, msg in self.latest().items():
                if before.get(key) is not msg and (point := _point(msg)) is not None:
                    self.history.setdefault(key, []).append(point)
            return n

    reader = open_reader(bootstrap, topic, timeout_s, HistoryReader)
    try:
        read_topic_to_end(reader, timeout_s)
        latest = reader.latest()
        history = reader.history
    finally:
        reader.close()
    chosen = _choose_id(sorted(latest), model_id, f"topic {topic!r}")
    if chosen is None:
        return None
    return Models(chosen, latest[chosen], history.get(chosen, []), f"topic {topic!r} on {bootstrap}")


def dead_letter_counts_topic(bootstrap: str, topic: str, timeout_s: float) -> Counter:
    """Dead letters per reason on a Kafka dead-letter topic (its ``reason`` headers)."""
    from connectors.kafka import dead_letter_reasons, security_options
    from stream_vips.cli.inspect import deadline_options, within

    security = {**security_options(), **deadline_options(timeout_s)}
    return within(timeout_s * 2, lambda: dead_letter_reasons(bootstrap, topic, security=security, timeout_s=timeout_s),
                  f"reading the dead-letter topic {topic!r}")


def dead_letter_counts(path: str | os.PathLike[str]) -> Counter:
    """Dead letters per reason in a JSONL dead-letter file (unparsable lines under ``(unreadable)``)."""
    counts: Counter = Counter()
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    reason = json.loads(line).get("reason")
                except (ValueError, AttributeError, RecursionError):  # RecursionError: nested too deeply
                    reason = None
                counts[str(reason) if reason is not None else "(unreadable)"] += 1
    except OSError as exc:
        raise ReportError(f"cannot read the dead-letter file {path}: {exc.strerror or exc}") from None
    return counts


# ---------------------------------------------------------------------------------------------
# privacy


def step_counts(n: int, points: int) -> list[int]:
    """The step counts the curve is evaluated at: all of 1..n when n <= ``points``, else
    ``points`` log-spaced counts (distinct after rounding) that include 1 and n."""
    import numpy as np

    if n <= 0:
        return []
    if n <= points:
        return list(range(1, n + 1))
    grid = np.unique(np.round(np.logspace(0.0, math.log10(n), max(2, points))).astype(np.int64))
    return sorted({int(k) for k in grid if 1 <= k <= n} | {1, n})


def epsilon_curve(events: Sequence[Any], delta: float, accountant: Any, points: int = DEFAULT_POINTS
                  ) -> list[tuple[int, float]]:
    """``[(k, epsilon after the first k ledger steps)]`` at :func:`step_counts`; one pass over the
    events (grouped by distinct event, as the accountant does) and one evaluation per count."""
    wanted = step_counts(len(events), points)
    out: list[tuple[int, float]] = []
    counts: OrderedDict = OrderedDict()
    i = 0
    for k, event in enumerate(events, 1):
        unit = event.unit()
        if unit not in counts:
            accountant.check(unit)
            counts[unit] = 0
        counts[unit] += event.count
        if i < len(wanted) and k == wanted[i]:
            out.append((k, float(accountant.epsilon_of_counts(OrderedDict(counts), delta))))
            i += 1
    return out


def mechanism_runs(events: Sequence[Any]) -> list[tuple[int, int, float, float]]:
    """``[(first step, last step, z, q)]``: runs of consecutive steps with the same noise
    multiplier and sampling rate (NaN for events without them), steps counted from 1."""
    runs: list[tuple[int, int, float, float]] = []
    for k, event in enumerate(events, 1):
        z = float(getattr(event, "noise_multiplier", math.nan))
        q = float(getattr(event, "sampling_rate", math.nan))
        if runs and _same(runs[-1][2], z) and _same(runs[-1][3], q):
            runs[-1] = (runs[-1][0], k, z, q)
        else:
            runs.append((k, k, z, q))
    return runs


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


# ---------------------------------------------------------------------------------------------
# the model


def predictive_summary(msg: Mapping[str, Any]) -> dict[str, Any]:
    """What the latest model says, rebuilt from its message (post-processing, no privacy cost):
    for every family ``hyperparameters`` and the natural parameters' ``shapes``, and the
    family's own summary (:meth:`~stream_vips.models.base.Model.summary`: ``{"kind":
    "coefficients", "mean": [...], "sd": [...]}`` for linreg and logistic, ``{"kind": "topics",
    "top_words": [[...], ...]}`` for lda) with its notes.
    """
    from stream_vips.client import posterior_from_message

    out: dict[str, Any] = {"kind": "parameters", "family": msg["family"],
                           "hyperparameters": dict(msg["hyperparameters"]),
                           "shapes": {k: list(v["shape"]) for k, v in msg["natural_parameters"].items()},
                           "notes": []}
    try:
        model = posterior_from_message(msg).model
    except Exception as exc:  # a family this installation cannot rebuild: shapes only
        out["notes"].append(f"the model could not be rebuilt ({type(exc).__name__}: {exc}); shapes only")
        return out
    try:
        found = dict(model.summary())
    except Exception as exc:  # numerical trouble in a summary must not lose the privacy report
        out["notes"].append(f"no predictive summary ({type(exc).__name__}: {exc})")
        return out
    notes = out["notes"] + list(found.pop("notes", []))
    out.update(found, notes=notes)
    return out


# ---------------------------------------------------------------------------------------------
# the report


@dataclass
class Report:
    """Everything drawn and written, computed once."""

    ledger: LedgerView
    models: Models
    accountant: str
    delta: float
    budget: float
    curve: list[tuple[int, float]]
    runs: list[tuple[int, int, float, float]]
    dead_letters: Counter | None
    summary: dict[str, Any]
    points: int
    warnings: list[str]

    @property
    def final_epsilon(self) -> float:
        return self.curve[-1][1] if self.curve else 0.0


def build_report(ledger: LedgerView, models: Models, dead_letters: Counter | None,
                 points: int = DEFAULT_POINTS) -> Report:
    """Recompute the privacy numbers from the ledger and check them against the latest model."""
    from stream_vips.messages import is_private
    from stream_vips.privacy.accountants import UnsupportedEvent, make_accountant

    msg = models.latest
    privacy = msg["privacy"]
    if not is_private(msg):
        raise ReportError(f"the latest model {models.model_id!r} is from a non-private run: it claims no "
                          "privacy guarantee and no ledger paid for it")
    sampling = privacy["sampling"]
    name = privacy.get("accountant")
    name = name if name in ("pld", "autodp", "strong") else "auto"
    accountant = make_accountant(name, sampling)
    delta, budget = float(privacy["delta"]), float(privacy["epsilon_budget"])
    try:
        curve = epsilon_curve(ledger.events, delta, accountant, points)
    except UnsupportedEvent as exc:
        raise ReportError(f"the ledger {ledger.path} holds an event the {accountant.name} accountant "
                          f"cannot bound: {exc}") from None
    warnings: list[str] = []
    paid_by = privacy.get("ledger_id")
    supersedes = ledger.genesis.get("supersedes", ())
    if paid_by is not None and paid_by != ledger.ledger_id and paid_by not in supersedes:
        warnings.append(f"the latest model names ledger {paid_by}, but {ledger.path} is ledger "
                        f"{ledger.ledger_id}: this ledger did not pay for it")
    steps = len(ledger.events)
    if int(privacy["steps"]) > steps:
        warnings.append(f"the latest model reflects {privacy['steps']} steps but the ledger holds only "
                        f"{steps}: the ledger was rolled back or is not the one that paid")
    reported = privacy.get("epsilon_spent")
    final = curve[-1][1] if curve else 0.0
    if reported is not None and not math.isclose(final, float(reported), rel_tol=1e-6, abs_tol=1e-9):
        warnings.append(f"epsilon recomputed from the ledger ({final:.6g} after {steps} steps) differs from "
                        f"the latest model's epsilon_spent ({float(reported):.6g}): steps taken after it "
                        "was published, or prepaid steps")
    if ledger.torn:
        warnings.append("the ledger's last line is torn (a write cut by a crash) and was left out")
    return Report(ledger, models, accountant.name, delta, budget, curve, mechanism_runs(ledger.events),
                  dead_letters, predictive_summary(msg), points, warnings)
