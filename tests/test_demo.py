"""`stream-vips demo`: runs with nothing but the package, halts on its budget, writes schema-valid
messages consistent with its ledger, and a JSON summary with the documented keys."""

from __future__ import annotations

import json

import pytest

from stream_vips import messages
from stream_vips.cli import main
from stream_vips.privacy.accountant import PldAccountant
from stream_vips.privacy.ledger import FileLedger


def test_demo_end_to_end(tmp_path, capsys):
    out, summary_file = tmp_path / "demo", tmp_path / "summary.json"
    code = main(["demo", "--records", "32000", "--out", str(out), "--json-summary", str(summary_file)])
    assert code == 0
    captured = capsys.readouterr()
    assert "records consumed" in captured.out and "non-private" in captured.out
    assert "records" in captured.err and "HALTED" in captured.err  # the progress bar

    s = json.loads(summary_file.read_text())
    for key in ("records", "updates", "epsilon_spent", "epsilon_budget", "halted", "messages_file"):
        assert key in s
    assert s["halted"] is True and s["updates"] == 20  # calibrated for 20 planned steps
    assert s["epsilon_spent"] <= s["epsilon_budget"] == 1.0
    assert s["records_rejected"] > 0 and s["metrics_port"] > 0

    with FileLedger(out / "ledger.jsonl") as ledger:
        events = ledger.events()
    assert len(events) == s["updates"]
    assert s["epsilon_spent"] == pytest.approx(PldAccountant().epsilon(events, 1e-5), rel=1e-9)
    msgs = [messages.loads(line) for line in (out / "models.jsonl").read_text().splitlines()]  # validates
    assert [m["version"] for m in msgs] == list(range(20)) + [19]
    assert msgs[-1]["privacy"]["halted"] and msgs[-1]["privacy"]["seeded"]
    # The non-private run on the same records is the floor the private model approaches.
    assert s["non_private_model_error"] < s["model_error"] < 10 * s["non_private_model_error"] + 0.2

    # Spent budget is never reset: the same output directory is refused.
    with pytest.raises(SystemExit, match="never reset"):
        main(["demo", "--records", "32000", "--out", str(out), "--no-progress"])


def test_demo_rejects_too_few_records(capsys):
    assert main(["demo", "--records", "100", "--no-progress"]) == 2
    assert "--records must be at least" in capsys.readouterr().err
