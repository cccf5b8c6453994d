"""What `stream-vips run` tells its user: start-up block, warnings, progress, summary, exit codes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def write_data(path: Path, n: int, dim: int = 3, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        for _ in range(n):
            x = rng.uniform(-0.5, 0.5, dim)
            fh.write(json.dumps({"x": x.tolist(), "y": float(x.sum())}) + "\n")


def run_cli(tmp_path: Path, config: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "cfg.yaml").write_text(config)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "stream_vips.cli", "run", "--config", "cfg.yaml", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


CONFIG = """
model: {family: linreg, params: {dim: 3}}
privacy: {epsilon: 1.0, planned_steps: %(planned)d}
sampling: {reservoir: 1000, batch_size: 100}
source: {type: jsonl, path: data.jsonl}
metrics: {port: %(port)d}
runtime: {on_halt: exit}
"""


def test_startup_block_warning_and_json_summary(tmp_path):
    write_data(tmp_path / "data.jsonl", 5000)
    out = run_cli(tmp_path, CONFIG % {"planned": 200, "port": 0}, "--json-summary", "summary.json", "--no-progress")
    assert out.returncode == 0, out.stderr
    err = out.stderr
    # the start-up block says what runs, where everything goes, and the real metrics port
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert f"metrics        http://0.0.0.0:{summary['metrics_port']}/metrics" in err and summary["metrics_port"] > 0
    assert "sampling       poisson, q = 0.1" in err and "ledger         ledger.jsonl (id " in err
    assert summary["ledger_id"] in err
    # a finite file that cannot reach the planned steps is announced before anything is spent
    assert "warning: the source has 5000 records: 5 updates of the 200 planned" in err
    assert summary["updates"] == 5 and summary["records"] == 5000 and summary["private"]
    assert 0 < summary["epsilon_spent"] < 0.5  # most of the budget unspent, as warned
    assert "epsilon spent  " in err


def test_too_few_records_for_one_update_is_said_not_silent(tmp_path):
    write_data(tmp_path / "data.jsonl", 500)
    out = run_cli(tmp_path, CONFIG % {"planned": 10, "port": 0}, "--json-summary", "-", "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "fewer than the 1000 needed before the first update" in out.stderr
    summary = json.loads(out.stdout)
    assert summary["updates"] == 0 and "reservoir holds 500 of 1000" in summary["no_update_because"]


def test_a_busy_metrics_port_is_one_line_naming_the_key_and_leaves_nothing_behind(tmp_path):
    write_data(tmp_path / "data.jsonl", 100)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run_cli(tmp_path, CONFIG % {"planned": 10, "port": port})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"stream-vips: configuration error: metrics.port: cannot serve metrics on 0.0.0.0:{port}: "
        "Address already in use"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml", "data.jsonl"]  # no ledger, no sinks


def test_a_wrong_dim_halts_before_spending_and_says_why(tmp_path):
    write_data(tmp_path / "data.jsonl", 5000)
    config = (CONFIG % {"planned": 8, "port": 0}).replace("dim: 3", "dim: 4")
    out = run_cli(tmp_path, config, "--json-summary", "-", "--no-progress")
    assert out.returncode == 8, out.stderr  # a halt on rejected data is not a clean end
    summary = json.loads(out.stdout)
    assert summary["updates"] == 0 and summary["halted"] and summary["epsilon_spent"] == 0.0
    assert "top rejection reasons: wrong_shape" in summary["halt_reason"]
    assert "halted         100% of the reservoir's slots hold rejected arrivals" in out.stderr


@pytest.mark.parametrize("setting, key", [
    ("privacy: {seed: -1}", "privacy.seed"),
    ("privacy: {epsilon: 1.0e+300}", "privacy.epsilon"),
    ("privacy: {noise_multiplier: 1.0e-300}", "privacy.noise_multiplier"),
    ("privacy: {ledger: {path: adir}}", "privacy.ledger.path"),
    ("metrics: {host: no such host!, port: 0}", "metrics.host"),
])
def test_a_bad_setting_is_exit_2_and_one_line_naming_the_key(tmp_path, setting, key):
    """Values that used to reach a bare traceback (exit 1) deep in the start-up (a directory as
    runtime.checkpoint_path needs a seekable source: tests/test_config.py)."""
    write_data(tmp_path / "data.jsonl", 10)
    (tmp_path / "adir").mkdir()
    section = setting.split(":", 1)[0]
    config = "\n".join(line for line in (CONFIG % {"planned": 10, "port": 0}).splitlines()
                       if not line.startswith(section + ":"))
    out = run_cli(tmp_path, config + "\n" + setting + "\n", "--no-progress")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stream-vips: configuration error: {key}: "), out.stderr
