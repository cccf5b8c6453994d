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

This module is the command (its options, exit codes and messages); what the report shows is read
and computed in :mod:`stream_vips.cli.report_data`, and drawn and written in
:mod:`stream_vips.cli.report_page`. Their names are re-exported here.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from stream_vips.cli.report_data import DEFAULT_POINTS as DEFAULT_POINTS
from stream_vips.cli.report_data import LedgerView as LedgerView
from stream_vips.cli.report_data import Models as Models
from stream_vips.cli.report_data import Report as Report
from stream_vips.cli.report_data import ReportError as ReportError
from stream_vips.cli.report_data import build_report as build_report
from stream_vips.cli.report_data import dead_letter_counts as dead_letter_counts
from stream_vips.cli.report_data import dead_letter_counts_topic as dead_letter_counts_topic
from stream_vips.cli.report_data import epsilon_curve as epsilon_curve
from stream_vips.cli.report_data import mechanism_runs as mechanism_runs
from stream_vips.cli.report_data import models_from_file as models_from_file
from stream_vips.cli.report_data import models_from_topic as models_from_topic
from stream_vips.cli.report_data import predictive_summary as predictive_summary
from stream_vips.cli.report_data import read_ledger as read_ledger
from stream_vips.cli.report_data import read_ledger_topic as read_ledger_topic
from stream_vips.cli.report_data import step_counts as step_counts
from stream_vips.cli.report_page import MATPLOTLIB_MISSING as MATPLOTLIB_MISSING
from stream_vips.cli.report_page import MAX_DRAWN as MAX_DRAWN
from stream_vips.cli.report_page import _check_matplotlib
from stream_vips.cli.report_page import render_html as render_html
from stream_vips.cli.report_page import render_png as render_png
from stream_vips.cli.report_page import write_report as write_report

PROG = "stream-vips report"

EXIT_CODES = """exit codes: 0 both files written; 1 no model (for --model-id, if given) in the model
file or topic; 2 bad input (a ledger, model or dead-letter file that cannot be read or is
corrupt, several model ids without --model-id, a model without a privacy guarantee, or
matplotlib not installed); 5 the broker did not answer within --timeout-s seconds; 7 the broker
refused access (authentication failed, or the user may not read a topic: the message names the
grant)"""


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
