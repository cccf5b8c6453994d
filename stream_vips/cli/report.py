"""``stream-vips report``: a privacy and model report as a PNG and a self-contained HTML page.

Reads a ledger (a file, or a Kafka ledger topic read committed without fencing its writer) and
the published models (a JSONL model file, or a model topic) and writes
``report.png`` and ``report.html`` to ``--out``:

* epsilon spent after each ledger step against the budget, recomputed from the ledger's events
  with the accountant the model messages name (``make_accountant``), at the delta they carry.
  The ledger alone decides the spent epsilon: reading it is post-processing and costs nothing.
  It is evaluated at a bounded set of step counts (every count up to ``--points``, else
  ``--points`` log-spaced counts plus the last), so a ledger of 10^6 steps costs about 200
  accountant evaluations; with the PLD accountant each value is an upper bound, exact at a grid
  of counts (``PldAccountant``). The epsilon the published messages report is drawn on top;
* steps over time: ledger events carry no timestamps, so time comes from the model messages
  (``created_at``, and ``version`` is the ledger step of the model's last release). A compacted
  topic keeps little history; a model file keeps all of it;
* the noise multiplier z and the sampling rate q of every step (from the ledger's events);
* dead letters per reason (``--dead-letters``: a JSONL dead-letter file, or ``--dead-letter-topic``:
  a Kafka dead-letter topic, read from its start, counting the ``reason`` headers);
* the latest model: its predictive summary (the family's own, ``Model.summary``: posterior mean
  and standard deviation of the coefficients for linreg and logistic, top words per topic for
  lda; hyperparameters and natural-parameter shapes for every family) and its privacy report.

The ledger is read without locking or changing it, so a report can be made while the pipeline
runs (a torn last line is left out). Plots need matplotlib: ``pip install 'stream_vips[report]'``.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import os
import sys
import textwrap
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from stream_vips.errors import StreamVipsError

PROG = "stream-vips report"

#: Default number of step counts the epsilon curve is evaluated at.
DEFAULT_POINTS = 200

#: Most points drawn per time series (longer series are thinned evenly, keeping the last).
MAX_DRAWN = 2000

MATPLOTLIB_MISSING = "the report needs matplotlib: pip install 'stream_vips[report]'"

EXIT_CODES = """exit codes: 0 both files written; 1 no model (for --model-id, if given) in the model
file or topic; 2 bad input (a ledger, model or dead-letter file that cannot be read or is
corrupt, several model ids without --model-id, a model without a privacy guarantee, or
matplotlib not installed); 5 the broker did not answer within --timeout-s seconds; 7 the broker
refused access (authentication failed, or the user may not read a topic: the message names the
grant)"""


class ReportError(StreamVipsError, ValueError):
    """Input the report cannot use (exit code 2); the message says which and why."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``report`` on an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "report", help="write a privacy and model report (PNG and HTML) from a ledger and the published models",
        description=textwrap.fill(
                    "Write DIR/report.png and DIR/report.html: epsilon spent over ledger steps against the "
                    "budget (recomputed from the ledger), steps over time, noise multiplier and sampling "
                    "rate per step, dead letters per reason and the latest model's predictive summary and "
                    "privacy report. Needs matplotlib (pip install 'stream_vips[report]').", 92),
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    led = p.add_mutually_exclusive_group(required=True)
    led.add_argument("--ledger", metavar="FILE", help="file ledger (JSON lines) that paid for the model")
    led.add_argument("--ledger-topic", metavar="TOPIC", help="Kafka ledger topic (with --bootstrap), read without "
                     "fencing its writer")
    p.add_argument("--ledger-name", default="default", help="the Kafka ledger's name (privacy.ledger.options.name "
                   "or ledger_id; default: %(default)s)")
    p.add_argument("--models", metavar="FILE", help="JSONL model file (one model message per line); without it the "
                   "models are read from --topic")
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers of the model and ledger topics")
    p.add_argument("--topic", default="stream-vips-models", help="model topic with --bootstrap (default: %(default)s)")
    dead = p.add_mutually_exclusive_group()
    dead.add_argument("--dead-letters", metavar="FILE", help="JSONL dead-letter file, for the counts per reason")
    dead.add_argument("--dead-letter-topic", metavar="TOPIC", help="Kafka dead-letter topic (with --bootstrap), "
                      "for the counts per reason (read from its start, reason headers only)")
    p.add_argument("--model-id", help="the model id (needed when the models hold several)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for report.png and report.html")
    p.add_argument("--points", type=int, default=DEFAULT_POINTS, metavar="N",
                   help="step counts the epsilon curve is evaluated at (default: %(default)s)")
    p.add_argument("--timeout-s", type=float, default=10.0, metavar="S",
                   help="seconds for the broker to answer, and again to read the topic (default: %(default)s)")
    return p


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


def _thin(items: Sequence[Any], most: int = MAX_DRAWN) -> list[Any]:
    if len(items) <= most:
        return list(items)
    step = len(items) / most
    return [items[int(i * step)] for i in range(most)] + [items[-1]]


def _check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError:
        raise ReportError(MATPLOTLIB_MISSING) from None


def render_png(report: Report) -> bytes:
    """The report figure as PNG bytes (matplotlib's object API: no pyplot, no global backend)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(16, 9.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    p = report.models.latest["privacy"]
    fig.suptitle(f"stream-vips report: model {report.models.model_id} ({report.models.latest['family']}), "
                 f"ledger {report.ledger.ledger_id}", fontsize=14)

    ax = axes[0, 0]
    if report.curve:
        ks, eps = zip(*report.curve)
        ax.plot(ks, eps, color="C0", lw=2, zorder=3, label=f"ledger ({report.accountant}, {len(ks)} step counts)")
    published = [(s, e) for s, _, e in _thin(report.models.history, 60) if e is not None]
    if published:  # at most ~60 hollow markers, so that the ledger's curve stays visible
        ax.plot(*zip(*published), ls="none", marker="o", ms=6, mfc="none", mec="C1", mew=1.5, zorder=4,
                label="published messages")
    ax.axhline(report.budget, color="C3", ls="--", lw=1.5, label=f"budget {report.budget:g}")
    ax.set_xlabel("ledger steps")
    ax.set_ylabel(f"epsilon at delta = {report.delta:g}")
    ax.set_title(f"epsilon spent: {report.final_epsilon:.4g} of {report.budget:g} after "
                 f"{len(report.ledger.events)} steps")
    ax.set_ylim(0, max(report.budget, report.final_epsilon) * 1.12)
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(alpha=0.3)

    ax = axes[0, 1]
    points = _thin(report.models.history)
    if points:
        steps, when = [s for s, _, _ in points], [w for _, w, _ in points]
        ax.plot(when, steps, marker="o" if len(points) < 60 else None, ms=4, color="C2", lw=1.5)
        from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

        if (max(when) - min(when)).total_seconds() < 2:  # a fit publishes within a second: give the
            pad = timedelta(seconds=1)                      # locator a range it has an interval for
            ax.set_xlim(min(when) - pad, max(when) + pad)
        locator = AutoDateLocator(maxticks=6)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    else:
        ax.text(0.5, 0.5, "no model messages with times", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("published at (UTC)")
    ax.set_ylabel("ledger steps (message version + 1)")
    ax.set_title(f"steps over time ({len(report.models.history)} messages)")
    ax.grid(alpha=0.3)

    ax = axes[0, 2]
    xs, zs, qs = [], [], []
    for first, last, z, q in report.runs:
        xs += [first, last + 1]
        zs += [z, z]
        qs += [q, q]
    if xs:
        single = len(report.runs) == 1
        ax.plot(xs, zs, color="C0", lw=2, label="noise multiplier z" + (f" = {zs[0]:.4g}" if single else ""))
        ax.set_ylim(0, max([z for z in zs if not math.isnan(z)] or [1.0]) * 1.3)
        ax2 = ax.twinx()  # q on its own axis, scaled so that its line sits below z's
        ax2.plot(xs, qs, color="C4", lw=2, ls="--", label="sampling rate q" + (f" = {qs[0]:.4g}" if single else ""))
        ax2.set_ylim(0, max([q for q in qs if not math.isnan(q)] or [1.0]) * 2.2)
        ax2.set_ylabel("sampling rate q")
        handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(handles, [h.get_label() for h in handles], loc="lower right", fontsize=9)
    ax.set_xlabel("ledger step")
    ax.set_ylabel("noise multiplier z (noise std / C)")
    ax.set_title(f"mechanism per step ({p['sampling']} sampling, {len(report.runs)} setting(s))")
    ax.grid(alpha=0.3)

    ax = axes[1, 0]
    if report.dead_letters:
        reasons = sorted(report.dead_letters.items(), key=lambda kv: (kv[1], kv[0]))
        y = np.arange(len(reasons))
        ax.barh(y, [n for _, n in reasons], color="C1")
        ax.set_yticks(y, [r for r, _ in reasons])
        for yi, (_, n) in zip(y, reasons):
            ax.text(n, yi, f" {n}", va="center", fontsize=9)
        ax.set_xlim(0, max(n for _, n in reasons) * 1.2)
        ax.set_xlabel("records")
        ax.set_title(f"dead letters per reason ({sum(report.dead_letters.values())} in all)")
    else:
        ax.axis("off")
        ax.set_title("dead letters per reason")
        ax.text(0.5, 0.5, "no dead letters" if report.dead_letters is not None else "no dead letters given",
                ha="center", va="center", transform=ax.transAxes, fontsize=11)

    ax = axes[1, 1]
    s = report.summary
    if s["kind"] == "coefficients":
        mean, sd = np.asarray(s["mean"]), np.asarray(s["sd"])
        shown = min(len(mean), 40)
        idx = np.arange(shown)
        ax.errorbar(mean[:shown], idx, xerr=2 * np.where(np.isfinite(sd[:shown]), sd[:shown], 0.0),
                    fmt="o", color="C0", ecolor="C0", capsize=3)
        ax.axvline(0, color="grey", lw=1)
        ax.set_yticks(idx, [f"w[{i}]" for i in idx])
        ax.invert_yaxis()
        ax.set_xlabel("posterior mean +- 2 sd")
        ax.set_title(f"latest model (version {report.models.latest['version']}): coefficients"
                     + (f" (first {shown} of {len(mean)})" if shown < len(mean) else ""))
        ax.grid(alpha=0.3)
    else:
        ax.axis("off")
        ax.set_title(f"latest model (version {report.models.latest['version']})")
        lines = [f"family {s['family']}"]
        if s["kind"] == "topics":
            lines += [f"topic {i}: {' '.join(words[:6])}" for i, words in enumerate(s["top_words"][:12])]
        else:
            lines += [f"{k}: {tuple(v)}" for k, v in list(s["shapes"].items())[:12]]
        ax.text(0.02, 0.95, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=10,
                transform=ax.transAxes)

    ax = axes[1, 2]
    ax.axis("off")
    ax.set_title("what the guarantee covers")
    lines = [f"record-level (epsilon, delta)-DP, {p['adjacency'].replace('_', '-')} adjacency",
             f"epsilon {report.final_epsilon:.4g} of budget {report.budget:g}, delta {report.delta:g}",
             f"accountant {report.accountant}; "
             + ("halted: budget spent" if p["halted"] else "still updating"),
             f"ledger {report.ledger.ledger_id}",
             "SEEDED noise: reproducible, not for production" if p["seeded"] else "noise seeded from OS entropy",
             "public (not covered): record counts, arrival",
             "positions and times, rejection reasons,",
             "dead-letter contents, update timing"]
    lines += [f"WARNING: {w}" for w in report.warnings][:3]
    ax.text(0.02, 0.95, "\n".join(_wrap(line, 52) for line in lines), va="top", ha="left", fontsize=10.5,
            transform=ax.transAxes)

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def _table(rows: Iterable[Sequence[Any]], head: Sequence[str] | None = None) -> str:
    e = html.escape
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{e(str(h))}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def render_html(report: Report, png: bytes) -> str:
    """A self-contained page (the PNG inline as base64): what is guaranteed, then the numbers."""
    e = html.escape
    msg, p = report.models.latest, report.models.latest["privacy"]
    steps = len(report.ledger.events)
    evaluated = len(report.curve)
    how = ("at every step count" if evaluated == steps else
           f"at {evaluated} log-spaced step counts from 1 to {steps} (not at every step)")
    pld = (" The pld accountant reports an upper bound on epsilon that is exact at a grid of step counts "
           "(every count to 256, then 1/256 apart)." if report.accountant == "pld" else "")
    seeded = ("<p class=warn><b>Seeded noise:</b> this run used a fixed seed (tests, demos, reproduction). "
              "Its noise is predictable: it gives no guarantee and is not for production.</p>"
              if p["seeded"] else "<p>Noise was drawn from a generator seeded by OS entropy (not seeded).</p>")
    warnings = "".join(f"<p class=warn><b>Warning:</b> {e(w)}</p>" for w in report.warnings)
    s = report.summary
    if s["kind"] == "coefficients":
        rows = ((f"w[{i}]", f"{m:.6g}", f"{sd:.6g}") for i, (m, sd) in enumerate(zip(s["mean"], s["sd"], strict=True)))
        model_table = _table(rows, ("coefficient", "posterior mean", "posterior sd"))
    elif s["kind"] == "topics":
        model_table = _table(((f"topic {i}", " ".join(words)) for i, words in enumerate(s["top_words"])),
                             ("topic", "most probable words"))
    else:
        model_table = ""
    shapes = _table(((k, tuple(v)) for k, v in s["shapes"].items()), ("natural parameter", "shape"))
    hyper = _table(((k, json.dumps(v)) for k, v in s["hyperparameters"].items()), ("hyperparameter", "value"))
    notes = "".join(f"<p>{e(n)}</p>" for n in s["notes"])
    privacy_rows = [(k, json.dumps(v)) for k, v in p.items()]
    if report.dead_letters is None:
        dead = ("<p>No dead letters were given (<code>--dead-letters FILE</code> or "
                "<code>--dead-letter-topic TOPIC</code>).</p>")
    elif not report.dead_letters:
        dead = "<p>There are no dead letters.</p>"
    else:
        dead = _table(sorted(report.dead_letters.items(), key=lambda kv: -kv[1]), ("reason", "records"))
    curve_rows = [(k, f"{eps:.6g}") for k, eps in report.curve]
    if len(curve_rows) > 12:
        curve_rows = curve_rows[:4] + [("...", "...")] + curve_rows[-7:]
    genesis = report.ledger.genesis
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>stream-vips report: {e(report.models.model_id)}</title>
<style>
body {{ font-family: sans-serif; max-width: 1200px; margin: 2em auto; line-height: 1.45; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; font-size: 0.95em; }}
th {{ background: #f3f3f3; }}
.warn {{ background: #fff4e0; border-left: 4px solid #e69500; padding: 0.4em 0.8em; }}
.big {{ font-size: 1.3em; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>Privacy and model report: model {e(report.models.model_id)}</h1>
<p class=big>epsilon spent <b id="epsilon-spent" data-value="{report.final_epsilon!r}">{report.final_epsilon:.6g}</b> of budget
<b>{report.budget:g}</b> at delta {report.delta:g} after {steps} ledger steps
({"halted: the budget is spent" if p["halted"] else "updates continue"}).</p>
{warnings}
<h2>What the guarantee covers</h2>
<p>Record-level (epsilon, delta)-differential privacy over the whole stream under <b>replace-one
adjacency</b>: two streams are neighbours when they have the same number of records at the same
arrival positions and times and one record's content differs. It covers everything released:
model messages, the ledger, logs and metrics, except what is public: the number of records, their
arrival positions and times, each record's validity and rejection reason (a dead letter's bytes
are not protected at all), and the timing of updates. Group privacy for k records of one person
costs roughly k times epsilon.</p>
<p>The spending is accounted on ledger <b id="ledger-id">{e(report.ledger.ledger_id)}</b>
(created {e(str(genesis.get("created_at", "unknown")))}{"; supersedes " + e(", ".join(genesis["supersedes"])) if genesis.get("supersedes") else ""}),
file {e(report.ledger.path)}.</p>
{seeded}
<h2>Figures</h2>
<img alt="epsilon over steps, steps over time, mechanism per step, dead letters, latest model"
 src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">
<h2>Epsilon spent</h2>
<p>Recomputed from the ledger's {steps} events with the {e(report.accountant)} accountant
(the one the model messages name) at delta {report.delta:g}, {how}.{pld} The latest model message
reports epsilon_spent {e(str(p.get("epsilon_spent")))} after {p["steps"]} steps.</p>
{_table(curve_rows, ("ledger steps", "epsilon"))}
<h2>Mechanism per step</h2>
{_table(((f"{a}-{b}", f"{z:.6g}", f"{q:.6g}") for a, b, z, q in report.runs), ("ledger steps", "noise multiplier z", "sampling rate q"))}
<h2>Latest model</h2>
<p>Model {e(report.models.model_id)}, family {e(msg["family"])}, version {msg["version"]},
published {e(str(msg["created_at"]))}, read from the {e(report.models.source)}. Everything below
is post-processing of the privatized release and costs no budget.</p>
{notes}
{model_table}
{shapes}
<h3>Hyperparameters</h3>
{hyper}
<h3>Privacy report of the latest message</h3>
{_table(privacy_rows, ("field", "value"))}
<h2>Dead letters</h2>
{dead}
</body></html>
"""  # noqa: E501 (an HTML page: its lines are as long as its text)


def write_report(report: Report, out: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.html`` into ``out`` (created); returns their paths."""
    _check_matplotlib()
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    png = render_png(report)
    png_path, html_path = directory / "report.png", directory / "report.html"
    png_path.write_bytes(png)
    html_path.write_text(render_html(report, png), encoding="utf-8")
    return png_path, html_path


def run(args: argparse.Namespace) -> int:
    """See :data:`EXIT_CODES`."""
    from stream_vips.cli.inspect import BrokerUnreachable

    def fail(line: str, code: int) -> int:
        print(f"{PROG}: {line}", file=sys.stderr)
        return code

    if args.points < 2:
        return fail(f"--points must be >= 2, got {args.points}", 2)
    if not args.timeout_s > 0:
        return fail(f"--timeout-s must be > 0, got {args.timeout_s!r}", 2)
    if args.bootstrap is None and (args.ledger_topic is not None or args.models is None
                                   or args.dead_letter_topic is not None):
        needs = ("--ledger-topic" if args.ledger_topic else "--dead-letter-topic" if args.dead_letter_topic
                 else "the model topic (or give --models FILE)")
        return fail(f"--bootstrap is needed to read {needs}", 2)
    try:
        _check_matplotlib()
        if args.ledger_topic is None:
            ledger = read_ledger(args.ledger)
        dead = dead_letter_counts(args.dead_letters) if args.dead_letters else None
        from connectors.kafka import KafkaAccessDenied, KafkaConnectorError

        try:
            if args.ledger_topic is not None:
                ledger = read_ledger_topic(args.bootstrap, args.ledger_topic, args.ledger_name, args.timeout_s)
            if args.dead_letter_topic is not None:
                dead = dead_letter_counts_topic(args.bootstrap, args.dead_letter_topic, args.timeout_s)
            if args.models is not None:
                models = models_from_file(args.models, args.model_id)
                where = f"the model file {args.models}"
            else:
                models = models_from_topic(args.bootstrap, args.topic, args.model_id, args.timeout_s)
                where = f"topic {args.topic!r}"
        except KafkaAccessDenied as exc:
            return fail(str(exc), 7)
        except KafkaConnectorError as exc:
            return fail(str(exc), 2)
        if models is None:
            return fail(f"no model{' ' + repr(args.model_id) if args.model_id else ''} in {where}", 1)
        report = build_report(ledger, models, dead, args.points)
        png_path, html_path = write_report(report, args.out)
    except BrokerUnreachable as exc:
        return fail(str(exc), 5)
    except ReportError as exc:
        return fail(str(exc), 2)
    except OSError as exc:
        return fail(f"cannot write the report to {args.out}: {exc.strerror or exc}", 2)
    except ValueError as exc:  # e.g. a schema version this reader does not know
        return fail(str(exc), 2)
    for warning in report.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    print(f"{PROG}: epsilon {report.final_epsilon:.6g} of {report.budget:g} after {len(ledger.events)} steps "
          f"(ledger {ledger.ledger_id}); wrote {png_path} and {html_path}", file=sys.stderr)
    return 0
