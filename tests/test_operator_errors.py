"""Operator errors found by review: each is one line with a documented exit code, leaks no secret,
loses no ledger and spends no budget."""

from __future__ import annotations

import pytest

import stream_vips.cli as cli

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
