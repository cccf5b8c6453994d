"""`stream-vips` CLI: run --config (exit codes, env overrides, config errors naming the key) and
the wiring of demo/plan/inspect subcommands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stream_vips.cli as cli
from connectors.synthetic import SyntheticRegressionSource
from stream_vips import messages
from stream_vips.privacy.ledger import FileLedger


def write_config(tmp_path, **privacy):
    records = tmp_path / "records.jsonl"
    lines = SyntheticRegressionSource(count=1_500, dimension=3, seed=4, malformed_fraction=0.02).generate(1_500)
    records.write_bytes(b"\n".join(lines) + b"\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"""
model: {{family: linreg, id: cli, params: {{dim: 3}}}}
privacy:
  epsilon: 100.0
  noise_multiplier: 2.0
  seed: 1
  ledger: {{type: file, path: {tmp_path / 'ledger.jsonl'}}}
sampling: {{method: fixed, reservoir: 500, batch_size: 100}}
schedule: {{every_records: 250}}
source: {{type: jsonl, path: {records}}}
sink: {{type: jsonl, path: {tmp_path / 'models.jsonl'}}}
dead_letter: {{type: jsonl, path: {tmp_path / 'dead.jsonl'}}}
metrics: {{enabled: false}}
runtime: {{on_halt: exit, publish_interval_s: 0}}
""")
    return config


def test_run_consumes_a_file_and_exits_zero(tmp_path, capsys):
    config = write_config(tmp_path)
    assert cli.main(["run", "--config", str(config)]) == 0
    msgs = [json.loads(x) for x in (tmp_path / "models.jsonl").read_text().splitlines()]
    with FileLedger(tmp_path / "ledger.jsonl") as ledger:
        n = len(ledger.events())
    assert n == 1 + (1_500 - 500) // 250 and [m["version"] for m in msgs] == list(range(n))
    assert all(m["model_id"] == "cli" for m in msgs)
    assert (tmp_path / "dead.jsonl").read_text().count("\n") > 0
    assert "stopped: 1500 records" in capsys.readouterr().err


def test_env_overrides_apply_to_run(tmp_path, monkeypatch):
    config = write_config(tmp_path)
    monkeypatch.setenv("STREAM_VIPS__MODEL__ID", "from-env")
    monkeypatch.setenv("STREAM_VIPS__SINK__PATH", str(tmp_path / "env-models.jsonl"))
    assert cli.main(["run", "--config", str(config)]) == 0
    first = json.loads((tmp_path / "env-models.jsonl").read_text().splitlines()[0])
    assert first["model_id"] == "from-env"
    assert not (tmp_path / "models.jsonl").exists()


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys, monkeypatch):
    config = write_config(tmp_path)
    monkeypatch.setenv("STREAM_VIPS__SAMPLING__BATCH_SIZE", "100000")
    assert cli.main(["run", "--config", str(config)]) == 2
    assert "configuration error: sampling.batch_size:" in capsys.readouterr().err
    assert not (tmp_path / "ledger.jsonl").exists()  # nothing started


def test_unwritable_sink_exits_1_after_closing_everything(tmp_path, capsys, monkeypatch):
    config = write_config(tmp_path)
    monkeypatch.setenv("STREAM_VIPS__SINK__PATH", "/dev/full")  # every write fails with ENOSPC
    assert cli.main(["run", "--config", str(config)]) == 1
    assert "publishing model version 0 failed" in capsys.readouterr().err
    with FileLedger(tmp_path / "ledger.jsonl") as ledger:  # released, charged, closed cleanly
        assert len(ledger.events()) == 1


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert cli.main(["run", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "demo", "plan", "inspect"])
def test_every_subcommand_is_wired(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    assert f"stream-vips {command}" in capsys.readouterr().out


def test_plan_runs_through_the_cli(capsys):
    code = cli.main(["plan", "--sampling", "fixed", "--batch-size", "10", "--reservoir", "100", "--steps", "5",
                     "--delta", "1e-5", "--noise-multiplier", "5", "--json"])
    assert code == 0 and "epsilon" in capsys.readouterr().out


def test_a_missing_subcommand_module_fails_clearly(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, "inspect", "stream_vips.does_not_exist")
    assert cli.main(["inspect", "--anything"]) == 2
    assert "not available" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert "stream-vips 0.1.0" in capsys.readouterr().out


def test_run_as_a_shell_filter_stdin_to_stdout(tmp_path):
    """source stdin, sink stdout, dead letters on stderr: `stream-vips run` in a pipeline."""
    config = tmp_path / "filter.yaml"
    config.write_text(f"""
model: {{family: linreg, params: {{dim: 3}}}}
privacy: {{epsilon: 100.0, noise_multiplier: 2.0, seed: 1, ledger: {{type: file, path: {tmp_path / 'ledger.jsonl'}}}}}
sampling: {{method: fixed, reservoir: 500, batch_size: 100}}
schedule: {{every_records: 500}}
source: {{type: stdin}}
sink: {{type: stdout}}
dead_letter: {{type: stderr}}
metrics: {{enabled: false}}
runtime: {{on_halt: exit, poll_timeout_s: 0.05, publish_interval_s: 0}}
""")
    lines = SyntheticRegressionSource(count=2_000, dimension=3, seed=4).generate(2_000) + [b"not json"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "stream_vips.cli", "run", "--config", str(config)],
                          input=b"\n".join(lines) + b"\n", capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    msgs = [messages.loads(line) for line in proc.stdout.splitlines()]  # stdout carries only messages
    assert [m["version"] for m in msgs] == [0, 1, 2, 3]
    dead = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith(b'{"reason"')]
    assert [(d["reason"], d["value"]) for d in dead] == [("invalid_json", "not json")]
