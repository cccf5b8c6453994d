"""The report's figure (a PNG drawn with matplotlib's object API) and its self-contained HTML page,
drawn from a :class:`~stream_vips.cli.report_data.Report`; :func:`write_report` writes both.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import textwrap
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from stream_vips.cli.report_data import Report, ReportError

#: Most points drawn per time series (longer series are thinned evenly, keeping the last).
MAX_DRAWN = 2000

MATPLOTLIB_MISSING = "the report needs matplotlib: pip install 'stream_vips[report]'"


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
