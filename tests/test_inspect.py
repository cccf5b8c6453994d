"""`stream-vips inspect`: JSONL model files (the latest valid message per id, read from the end;
invalid and torn lines skipped), non-private reports, and an unreachable broker as one line with
exit code 5 within --timeout-s."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest

import stream_vips.cli as cli
from stream_vips import messages
from stream_vips.cli import inspect as sv_inspect
from stream_vips.io import reverse_lines


def message(model_id: str, version: int, private: bool = True) -> dict:
    report = messages.privacy_report(
        epsilon_spent=0.1 * (version + 1) if private else float("inf"), delta=1e-5,
        epsilon_budget=1.0 if private else float("inf"), accountant="pld" if private else "none",
        sampling="poisson", q=0.1, noise_multiplier=2.0 if private else 0.0, steps=version + 1, halted=False,
        seeded=True, ledger_id="abc" if private else None, private=private)
    return messages.build_message(model_id, "linreg", {"dim": 2}, version,
                                  {"precision": np.eye(2), "shift": np.full(2, float(version))}, report)


def write_models(path: Path, torn: bool = True) -> None:
    lines = [messages.dumps(message(mid, v)).decode() for v in range(3) for mid in ("a", "b") if (mid, v) != ("b", 2)]
    lines.append('{"model_id": "a", "version": 9, "not": "a valid message"}')  # newest "a" line: invalid
    text = "\n".join(lines) + "\n"
    if torn:
        text += messages.dumps(message("b", 5)).decode()[:80]  # a write cut by a crash
    path.write_text(text)


def run_json(capsys, *args: str) -> tuple[int, dict | None, str]:
    code = cli.main(["inspect", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_a_model_file_shows_the_latest_valid_model_per_id(tmp_path, capsys):
    path = tmp_path / "models.jsonl"
    write_models(path)
    code, out, err = run_json(capsys, "--file", str(path))
    assert code == 0
    assert out["file"] == str(path)
    assert [(m["model_id"], m["version"]) for m in out["models"]] == [("a", 2), ("b", 1)]
    assert out["models"][0]["natural_parameters"]["precision"] == {"dtype": "float64", "shape": [2, 2]}
    assert out["models"][0]["privacy"]["ledger_id"] == "abc"
    assert "skipped 2 invalid line(s)" in err and err.count("\n") == 1

    assert cli.main(["inspect", "--file", str(path)]) == 0
    text = capsys.readouterr().out
    assert "model a  family linreg  version 2" in text and "model b  family linreg  version 1" in text
    assert "epsilon 0.3 of 1" in text and "SEEDED NOISE" in text


def test_model_id_filters_and_an_absent_id_exits_1(tmp_path, capsys):
    path = tmp_path / "models.jsonl"
    write_models(path, torn=False)
    code, out, _ = run_json(capsys, "--file", str(path), "--model-id", "b")
    assert code == 0 and [(m["model_id"], m["version"]) for m in out["models"]] == [("b", 1)]
    code, out, err = run_json(capsys, "--file", str(path), "--model-id", "zzz")
    assert code == 1 and out == {"file": str(path), "models": []} and "no model 'zzz'" in err


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["inspect", "--file", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err and "Traceback" not in err


def test_a_file_written_by_a_real_run_is_read(tmp_path, capsys):
    from connectors.synthetic import SyntheticRegressionSource

    records = tmp_path / "records.jsonl"
    records.write_bytes(b"\n".join(SyntheticRegressionSource(count=1_000, dimension=3, seed=4).generate(1_000)) + b"\n")
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({
        "model": {"family": "linreg", "id": "real", "params": {"dim": 3}},
        "privacy": {"epsilon": 50.0, "noise_multiplier": 2.0, "seed": 1,
                    "ledger": {"type": "file", "path": str(tmp_path / "ledger.jsonl")}},
        "sampling": {"method": "fixed", "reservoir": 500, "batch_size": 100},
        "schedule": {"every_records": 250}, "source": {"type": "jsonl", "path": str(records)},
        "sink": {"type": "jsonl", "path": str(tmp_path / "models.jsonl")},
        "dead_letter": {"type": "jsonl", "path": str(tmp_path / "dead.jsonl")},
        "metrics": {"enabled": False}, "runtime": {"on_halt": "exit", "publish_interval_s": 0}}))
    assert cli.main(["run", "--config", str(config), "--no-progress"]) == 0
    capsys.readouterr()
    last = json.loads((tmp_path / "models.jsonl").read_text().splitlines()[-1])
    code, out, _ = run_json(capsys, "--file", str(tmp_path / "models.jsonl"))
    assert code == 0 and len(out["models"]) == 1
    assert out["models"][0]["version"] == last["version"] == 2
    assert out["models"][0]["privacy"] == last["privacy"]


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_reverse_lines_is_the_file_backwards_at_any_block_size(tmp_path, block):
    path = tmp_path / "lines"
    lines = [b"x" * n for n in (3, 0, 200, 1, 70)] + [b"last"]
    path.write_bytes(b"\n".join(lines) + b"\nto")  # no newline after "to": torn
    got = list(reverse_lines(path, block))
    assert got == [(b"to", True)] + [(line, False) for line in reversed(lines) if line]
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert [torn for _, torn in reverse_lines(path, block)] == [False] * 5


def test_a_non_private_report_claims_no_guarantee():
    summary = sv_inspect.summary(message("base", 0, private=False))
    text = sv_inspect.format_text([summary])
    assert "privacy: NONE" in text and "epsilon" not in text.split("privacy: NONE")[1].splitlines()[0]
    # and its state says non-private, never "updating" or "budget spent" (it has no budget)
    assert "[non-private]" in text.splitlines()[0] and "budget" not in text.splitlines()[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on return: connections are refused


def test_an_unreachable_broker_is_one_line_and_exit_5_within_the_deadline(capsys):
    started = time.monotonic()
    code = cli.main(["inspect", "--bootstrap", f"127.0.0.1:{closed_port()}", "--topic", "t", "--timeout-s", "1.5"])
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 5 and elapsed < 1.5 * 2 + 3, elapsed
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("stream-vips inspect: cannot reach the Kafka broker at 127.0.0.1:")
    assert "KafkaTimeoutError: KafkaTimeoutError" not in err and "Traceback" not in err


def test_the_default_deadline_is_documented_and_short():
    import argparse

    parser = argparse.ArgumentParser()
    sub = sv_inspect.add_parser(parser.add_subparsers())
    assert sub.parse_args(["--bootstrap", "x:1"]).timeout_s == sv_inspect.DEFAULT_TIMEOUT_S == 10.0
    assert "--timeout-s" in sub.format_help() and "5 the broker" in sub.format_help()


def test_the_hard_deadline_ends_work_that_never_returns():
    started = time.monotonic()
    with pytest.raises(sv_inspect.BrokerUnreachable, match="no answer within 0.2 s"):
        sv_inspect.within(0.2, lambda: time.sleep(30), "waiting")
    assert time.monotonic() - started < 5
    assert sv_inspect.within(1.0, lambda: 42, "quick") == 42
    with pytest.raises(KeyError):
        sv_inspect.within(1.0, lambda: {}["x"], "failing")


def test_error_text_names_the_error_once():
    class KafkaTimeoutError(Exception):
        pass

    assert sv_inspect.error_text(KafkaTimeoutError("KafkaTimeoutError: Unable to bootstrap")) == \
        "KafkaTimeoutError: Unable to bootstrap"


@pytest.mark.parametrize("change", [dict(noise_multiplier=0.0, paper_sigma=0.0, accountant="none"),
                                    dict(epsilon_spent=50.0)])
def test_a_newer_line_claiming_privacy_it_does_not_have_is_skipped_not_shown_with_an_epsilon(tmp_path, change):
    bad = message("a", 3)
    bad["privacy"].update(change)  # dumped as is: a writer that skipped validation
    path = tmp_path / "models.jsonl"
    path.write_text(messages.dumps(message("a", 2)).decode() + "\n" + messages.dumps(bad).decode() + "\n")
    latest, skipped = sv_inspect.latest_in_file(path)
    assert latest["a"]["version"] == 2 and len(skipped) == 1
    assert "privacy/accountant" in skipped[0] or "claims privacy it does not have" in skipped[0]
