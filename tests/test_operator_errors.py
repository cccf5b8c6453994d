"""Operator errors found by review: each is one line with a documented exit code, leaks no secret,
loses no ledger and spends no budget."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

import stream_vips.cli as cli
from stream_vips import reset
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import FileLedger

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
    frozen = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)  # both resets in the same second

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
