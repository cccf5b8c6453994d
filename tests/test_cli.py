"""`stream-vips` CLI: run --config (exit codes, env overrides, config errors naming the key) and
the wiring of demo/plan/inspect subcommands."""

from __future__ import annotations

import json
import os
import re
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
    assert "records        1500 (" in capsys.readouterr().err  # the final summary


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
        assert 1 <= len(ledger.events()) <= 2  # the step, and the next one if it was paid ahead


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert cli.main(["run", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(cli.SUBCOMMANDS))
def test_every_subcommand_is_wired(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    assert f"stream-vips {command}" in capsys.readouterr().out


def test_every_subcommand_is_registered_with_its_help_line(capsys):
    """SUBCOMMANDS is the one registry: (module, help line) per name, listed by the top-level help."""
    assert {"run", "demo", "plan", "inspect", "reset"} <= set(cli.SUBCOMMANDS)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = " ".join(capsys.readouterr().out.split())  # argparse wraps long help lines
    for name, entry in cli.SUBCOMMANDS.items():
        assert isinstance(entry, tuple) and len(entry) == 2, name
        module, help_line = entry
        assert module.startswith("stream_vips.") and help_line.strip(), name
        assert f"{name} {help_line}" in top, name


#: Subcommand modules that import numpy at module level, so their --help loads it (and nothing
#: else heavy: they import models, scipy and the pipeline on first use).
HEAVY_AT_IMPORT = {"fit"}
#: (``stream_vips.models.base``: every family's module imports it; the registry of families is light.)
HEAVY = ("numpy", "scipy", "kafka", "dp_accounting", "autodp", "stream_vips.models.base", "stream_vips.service.app")


def _modules_after(code: str) -> dict[str, list[str]]:
    """Run ``code`` in a fresh interpreter (stdout silenced) and return which of HEAVY it loaded,
    and which subcommand modules."""
    script = f"""
import contextlib, io, json, sys
import stream_vips.cli as cli
with contextlib.redirect_stdout(io.StringIO()):
    try:
        {code}
    except SystemExit:
        pass
loaded = [m for m in {HEAVY!r} if m in sys.modules]
subcommands = [m for m, _ in cli.SUBCOMMANDS.values() if m in sys.modules and m != "stream_vips.cli"]
print(json.dumps({{"heavy": loaded, "subcommands": subcommands}}))
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout.decode().splitlines()[-1])


def test_top_level_help_imports_no_subcommand_and_no_numpy():
    """`stream-vips --help` is built from SUBCOMMANDS alone (a module-import check, not a timing)."""
    loaded = _modules_after("cli.main(['--help'])")
    assert loaded == {"heavy": [], "subcommands": []}
    assert _modules_after("cli.build_parser().format_help()") == {"heavy": [], "subcommands": []}


@pytest.mark.parametrize("command", sorted(set(cli.SUBCOMMANDS) - HEAVY_AT_IMPORT))
def test_subcommand_help_imports_only_its_own_module(command):
    loaded = _modules_after(f"cli.main([{command!r}, '--help'])")
    own = cli.SUBCOMMANDS[command][0]
    assert loaded["heavy"] == [] and set(loaded["subcommands"]) <= {own}, loaded


@pytest.mark.parametrize("command", sorted(HEAVY_AT_IMPORT))
def test_numpy_subcommand_help_loads_numpy_only(command):
    loaded = _modules_after(f"cli.main([{command!r}, '--help'])")
    own = cli.SUBCOMMANDS[command][0]
    assert loaded["heavy"] == ["numpy"] and set(loaded["subcommands"]) <= {own}, loaded


#: Sphinx/RST markup that has no place in a terminal.
MARKUP = ("``", ":class:", ":func:", ":meth:", ":mod:", ":data:", ":attr:")


@pytest.mark.parametrize("command", [None, *sorted(cli.SUBCOMMANDS)])
def test_help_texts_are_plain_and_cite_only_files_in_the_repository(command, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"] if command is None else [command, "--help"])
    text = capsys.readouterr().out
    for markup in MARKUP:
        assert markup not in text, (command, markup)
    assert "DESIGN" not in text.upper(), command
    root = Path(__file__).resolve().parents[1]
    for cited in re.findall(r"\b(?:docs|k8s|benchmarks|tools|stream_vips)/[\w./-]*\w", " ".join(text.split())):
        assert (root / cited).exists(), (command, cited)


def test_plain_strips_rst_but_keeps_the_words():
    assert cli.plain("see ``--out`` and :class:`~a.B` or :func:`f`") == "see --out and a.B or f"


def test_plan_runs_through_the_cli(capsys):
    code = cli.main(["plan", "--sampling", "fixed", "--batch-size", "10", "--reservoir", "100", "--steps", "5",
                     "--delta", "1e-5", "--noise-multiplier", "5", "--json"])
    assert code == 0 and "epsilon" in capsys.readouterr().out


def test_a_missing_subcommand_module_fails_clearly(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, "inspect", ("stream_vips.does_not_exist", "print nothing"))
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
