"""Operator errors found by review: each is one line with a documented exit code, leaks no secret,
loses no ledger and spends no budget."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import stream_vips.cli as cli
from connectors.synthetic import SyntheticRegressionSource
from stream_vips.cli import reset
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import FileLedger, LedgerCorrupt

PASSWORD = "90210773"  # numeric: YAML reads it as an int, which fails the str check
KAFKA_SOURCE = ("source: {type: kafka, bootstrap_servers: 'k:9092', topics: t, group_id: g, sasl_username: u, "
                "sasl_mechanism: PLAIN, security_protocol: SASL_SSL%s}\nmetrics: {enabled: false}\n")


@pytest.mark.parametrize("command", ["run", "config"])
@pytest.mark.parametrize("where", ["env", "yaml", "env-not-yaml"])
def test_a_secret_is_never_echoed_by_a_configuration_error(tmp_path, monkeypatch, capsys, command, where):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "cfg.yaml"
    if where == "yaml":
        config.write_text(KAFKA_SOURCE % f", sasl_password: {PASSWORD}")
    else:
        config.write_text(KAFKA_SOURCE % "")
        value = PASSWORD if where == "env" else f"[{PASSWORD}"  # "[90210773": not valid YAML
        monkeypatch.setenv("STREAM_VIPS__SOURCE__SASL_PASSWORD", value)
    assert cli.main([command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "source.sasl_password" in err and "<redacted>" in err
    assert PASSWORD not in err


@pytest.mark.parametrize("text", [
    'source:\n  sasl_password: "%s\n  x: 1\n',     # an unterminated quote runs to the end of the file
    "source: {sasl_password: %s: x}\n",               # a colon inside the value
    "source:\n  ssl_key: [%s\n",                     # an unclosed flow sequence
])
def test_a_yaml_syntax_error_in_a_secret_line_is_one_line_without_the_secret(tmp_path, monkeypatch, capsys, text):
    """The parser's own message quotes the offending lines (the password with them)."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "cfg.yaml"
    config.write_text(text % PASSWORD)
    assert cli.main(["config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert PASSWORD not in err and "not valid YAML: line " in err and "<redacted>" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("text, reason", [
    ("source:\n  sasl_password:\n    *x%s\n", "found undefined alias '...'"),  # the value on the next line
    ("source: {type: kafka, sasl_password:\n   *x%s}\n", "found undefined alias '...'"),
    ("source:\n  sasl_password:\n    !x'%s\n", "constructor for the tag '...'"),  # quoted with double quotes
    ("source:\n  sasl_password: !!int x%s\n", "a value cannot be built as its type (ValueError"),
    ("source:\n  sasl_password: !!float x%s\n", "a value cannot be built as its type (ValueError"),
    ("source:\n  sasl_password: !!bool x%s\n", "a value cannot be built as its type (KeyError"),
    ("source:\n  sasl_password: !!timestamp 99999-01-01 # %s\n", "a value cannot be built as its type (Attribute"),
])
def test_text_the_yaml_parser_quotes_from_the_document_is_not_repeated(tmp_path, monkeypatch, capsys, text, reason):
    """The parser quotes an undefined alias or a tag, and a tag it cannot build (``!!int``) raises
    a plain ValueError quoting the value: on a line that does not name its key the secret-line
    check cannot see it, so quoted document text is cut out of every reason, and a value that
    cannot be built is one line without it (it used to be a traceback)."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "cfg.yaml"
    config.write_text(text % PASSWORD)
    assert cli.main(["config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert PASSWORD not in err and reason in err and err.count("\n") == 1


def test_a_yaml_syntax_error_elsewhere_says_where_and_why_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "cfg.yaml"
    config.write_text("sampling:\n  reservoir: [100\n")
    assert cli.main(["config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML: line 2, column 14: while parsing a flow sequence" in err and "<redacted>" not in err
    assert err.count("\n") == 1


def reset_config(tmp_path: Path) -> Path:
    config = tmp_path / "reset.yaml"
    config.write_text(f"privacy: {{ledger: {{type: file, path: {tmp_path / 'ledger.jsonl'}}}}}\n"
                      f"sink: {{type: jsonl, path: {tmp_path / 'models.jsonl'}}}\nmetrics: {{enabled: false}}\n")
    return config


def ledger_with_steps(path: Path, steps: int) -> None:
    with FileLedger(path) as ledger:
        for i in range(steps):
            ledger.append(SubsampledGaussianEvent(1.0 + i / 100, 0.1, "poisson"), position=i)


def test_two_resets_in_one_second_keep_both_old_ledgers(tmp_path, monkeypatch, capsys):
    config = reset_config(tmp_path)
    ledger_with_steps(tmp_path / "ledger.jsonl", 5)
    frozen = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)  # both resets in the same second

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz=None):
            return frozen

    monkeypatch.setattr(reset, "datetime", FrozenClock)
    assert cli.main(["reset", "--config", str(config), "--yes"]) == 0
    assert cli.main(["reset", "--config", str(config), "--yes"]) == 0
    kept = sorted(tmp_path.glob("ledger.jsonl.superseded-*"))
    assert [p.name for p in kept] == ["ledger.jsonl.superseded-20260102T030405Z",
                                      "ledger.jsonl.superseded-20260102T030405Z-2"]
    with FileLedger(kept[0]) as first, FileLedger(kept[1]) as second, FileLedger(tmp_path / "ledger.jsonl") as new:
        assert len(first.events()) == 5 and len(second.events()) == 0  # the paid steps survive
        assert set(new.supersedes) == {first.ledger_id, second.ledger_id}


def test_reset_while_another_holder_has_the_ledger_is_one_line_exit_3_and_changes_nothing(tmp_path, capsys):
    config = reset_config(tmp_path)
    ledger_with_steps(tmp_path / "ledger.jsonl", 3)
    before = (tmp_path / "ledger.jsonl").read_bytes()
    with FileLedger(tmp_path / "ledger.jsonl"):  # a running pipeline holds the lock
        assert cli.main(["reset", "--config", str(config), "--yes"]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "held by this process" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.jsonl", "reset.yaml"]
    assert (tmp_path / "ledger.jsonl").read_bytes() == before


def run_config(tmp_path: Path, records: int = 1_500) -> Path:
    """A small file-to-file run: 3-dim linreg, a step every 250 records once 500 are held."""
    data = tmp_path / "records.jsonl"
    lines = SyntheticRegressionSource(count=records, dimension=3, seed=4).generate(records)
    data.write_bytes(b"\n".join(lines) + b"\n")
    config = tmp_path / "config.yaml"
    config.write_text(f"""
model: {{family: linreg, id: ops, params: {{dim: 3}}}}
privacy: {{epsilon: 100.0, noise_multiplier: 2.0, seed: 1, ledger: {{type: file, path: {tmp_path / 'ledger.jsonl'}}}}}
sampling: {{method: fixed, reservoir: 500, batch_size: 100}}
schedule: {{every_records: 250}}
source: {{type: jsonl, path: {data}}}
sink: {{type: jsonl, path: {tmp_path / 'models.jsonl'}}}
dead_letter: {{type: jsonl, path: {tmp_path / 'dead.jsonl'}}}
metrics: {{enabled: false}}
runtime: {{on_halt: exit, publish_interval_s: 0}}
""")
    return config


def fail_writes_to(monkeypatch, name: str, after: int) -> None:
    """``os.write`` to the file called ``name`` succeeds ``after`` times, then writes half of
    the next buffer and raises ENOSPC: a disk that fills up mid-line."""
    real_write = os.write
    calls = {"n": 0}

    def write(fd: int, data) -> int:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) != name:
            return real_write(fd, data)
        calls["n"] += 1
        if calls["n"] <= after:
            return real_write(fd, data)
        if calls["n"] == after + 1 and len(data) > 1:
            return real_write(fd, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_at_the_ledger_is_one_line_exit_6_whole_lines_and_no_unpaid_model(tmp_path, monkeypatch, capsys):
    config = run_config(tmp_path)
    fail_writes_to(monkeypatch, "ledger.jsonl", after=3)  # the genesis and steps 0, 1; step 2 tears
    assert cli.main(["run", "--config", str(config), "--no-progress"]) == 6
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [text for text in err.splitlines() if "privacy.ledger.path" in text]
    assert line.startswith("stream-vips: stopped:") and "no step was released" in line
    raw = (tmp_path / "ledger.jsonl").read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 3  # cut back to whole lines: genesis + 2 steps
    with FileLedger(tmp_path / "ledger.jsonl") as ledger:
        assert len(ledger.events()) == 2
    versions = [json.loads(text)["version"] for text in (tmp_path / "models.jsonl").read_text().splitlines()]
    assert versions and max(versions) == 1  # no model for the step whose line is missing


@pytest.mark.parametrize("where", ["genesis", "event"])
def test_a_deeply_nested_ledger_line_is_corrupt_and_run_refuses_with_exit_3(tmp_path, capsys, where):
    config = run_config(tmp_path, records=10)
    path = tmp_path / "ledger.jsonl"
    deep = b"[" * 100_000 + b"]" * 100_000  # deeper than Python's stack: json.loads raises RecursionError
    if where == "genesis":
        path.write_bytes(b'{"genesis":' + deep + b"}\n")
    else:
        FileLedger(path).close()  # a genesis, then the deep event line
        path.write_bytes(path.read_bytes() + b'{"event":' + deep + b',"step":0}\n')
    with pytest.raises(LedgerCorrupt, match="nested too deeply"):
        FileLedger(path)
    assert cli.main(["run", "--config", str(config), "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to start" in err and "corrupt" in err, err


@pytest.mark.parametrize("summary", ["missing-dir/s.json", "."])
def test_an_unwritable_json_summary_is_refused_before_the_run_spends_anything(tmp_path, capsys, summary):
    config = run_config(tmp_path)
    assert cli.main(["run", "--config", str(config), "--no-progress", "--json-summary", str(tmp_path / summary)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("stream-vips: --json-summary ") and "Traceback" not in err
    assert not (tmp_path / "ledger.jsonl").exists() and not (tmp_path / "models.jsonl").exists()  # nothing spent


def test_a_json_summary_that_fails_at_the_end_is_one_line_exit_2(tmp_path, capsys):
    config = run_config(tmp_path)
    assert cli.main(["run", "--config", str(config), "--no-progress", "--json-summary", "/dev/full"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.splitlines()[-1].startswith("stream-vips: --json-summary /dev/full: cannot")


@pytest.mark.parametrize("option", [["--out", "/dev/full"], ["--out", "FILE"], ["--metrics-port", "99999"],
                                    ["--seed", "-1"], ["--json-summary", "missing-dir/s.json"]])
def test_a_bad_demo_option_is_one_line_exit_2_and_spends_nothing(tmp_path, capsys, option):
    (tmp_path / "FILE").write_text("not a directory\n")
    flag, value = option
    value = value if value.startswith("/") or value[0] in "-9" else str(tmp_path / value)
    args = ["demo", "--no-progress", *(["--out", str(tmp_path / "out")] if flag != "--out" else []), flag, value]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"stream-vips demo: {flag}"), err
    assert not list(tmp_path.rglob("ledger.jsonl"))  # nothing spent


SINK_FILLS_UP = """
import json, resource, signal, sys
from connectors.jsonl import JsonlDeadLetterSink, JsonlSink
from stream_vips.io import DeadLetter, RawRecord

kind, path = sys.argv[1], sys.argv[2]
sink = JsonlSink(path) if kind == "models" else JsonlDeadLetterSink(path)

def put(i):
    if kind == "models":
        sink.publish("m", {"model_id": "m", "version": i, "pad": "x" * 200})
    else:
        sink.send([DeadLetter(RawRecord(b"{bad %d" % i + b"x" * 200, {"line": i}), "invalid_json", "not JSON")])
    sink.flush()

put(0)
size = len(open(path, "rb").read())
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit a write fails with EFBIG, like ENOSPC
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))  # the next line fits half way
try:
    put(1)
except OSError as exc:
    print("failed:", exc.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
put(2)
sink.close()
"""


@pytest.mark.parametrize("kind", ["models", "dead"])
def test_a_sink_write_that_fills_the_disk_leaves_whole_lines_and_the_next_line_is_not_glued(tmp_path, kind):
    path = tmp_path / f"{kind}.jsonl"
    out = subprocess.run([sys.executable, "-c", SINK_FILLS_UP, kind, str(path)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0 and out.stdout.strip() == f"failed: {errno.EFBIG}", out.stderr
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3, lines  # two whole lines (0 and 2), no torn one
    assert [json.loads(line)["version" if kind == "models" else "origin"] for line in lines[:-1]]


# -- secrets as mounted files ---------------------------------------------------------------------

def _kafka_config(tmp_path: Path, extra: str) -> Path:
    config = tmp_path / "cfg.yaml"
    config.write_text(KAFKA_SOURCE % extra)
    return config


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "both"])
def test_a_secret_file_that_cannot_be_used_stops_the_start_naming_the_key(tmp_path, monkeypatch, capsys, case):
    """One line, exit 2, before any connection is made: the key, the path and why."""
    monkeypatch.chdir(tmp_path)
    path = {"missing": tmp_path / "absent", "directory": tmp_path,
            "empty": tmp_path / "empty"}.get(case, tmp_path / "pw")
    (tmp_path / "empty").write_text("")
    (tmp_path / "pw").write_text(PASSWORD)
    extra = f", sasl_password_file: '{path}'" + (f", sasl_password: '{PASSWORD}'" if case == "both" else "")
    assert cli.main(["run", "--config", str(_kafka_config(tmp_path, extra))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and PASSWORD not in err
    expected = {"missing": f"source: sasl_password_file: cannot read {path}: No such file or directory",
                "directory": f"source: sasl_password_file: cannot read {path}: Is a directory",
                "empty": f"source: sasl_password_file: {path} is empty",
                "both": "source: sasl_password and sasl_password_file: give the secret or its file, not both"}[case]
    assert f"stream-vips: configuration error: {expected}" in err, err


def test_the_environment_fallback_may_name_a_secret_file_too(tmp_path, monkeypatch):
    from connectors.kafka import security_options
    from stream_vips import logsafety
    from stream_vips.config import ConfigError

    secret = tmp_path / "password"
    secret.write_text(f"file-{PASSWORD}\n")  # the newline a pipe into --from-file=/dev/stdin leaves
    env = {"STREAM_VIPS_KAFKA_SASL_PASSWORD_FILE": str(secret)}
    options = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u"}
    assert security_options(options, env=env)["sasl_plain_password"] == f"file-{PASSWORD}"
    assert f"file-{PASSWORD}" in logsafety._secrets  # redacted wherever the client would log it
    # an option wins over the environment, and a key file's password is a secret file too
    key_password = tmp_path / "key-password"
    key_password.write_text("kp-secret")
    resolved = security_options({**options, "sasl_password": "inline", "ssl_keyfile_password_file": str(key_password)},
                                env=env)
    assert resolved["sasl_plain_password"] == "inline" and resolved["ssl_password"] == "kp-secret"
    with pytest.raises(ConfigError, match=r"^STREAM_VIPS_KAFKA_SASL_PASSWORD_FILE: cannot read .*absent"):
        security_options(options, env={"STREAM_VIPS_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "absent")})


def test_config_shows_where_a_secret_file_is_never_what_it_holds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD)
    monkeypatch.setenv("STREAM_VIPS_KAFKA_SSL_KEYFILE_PASSWORD_FILE", str(secret))
    config = _kafka_config(tmp_path, f", sasl_password_file: '{secret}'")
    assert cli.main(["config", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert PASSWORD not in out
    assert f"sasl_password_file: {secret}" in out
    assert f"STREAM_VIPS_KAFKA_SSL_KEYFILE_PASSWORD_FILE={secret}" in out
