"""`stream-vips config`: the effective configuration after environment overrides (YAML or JSON),
with secrets redacted wherever they come from, and bad configuration as exit code 2."""

from __future__ import annotations

import json

import yaml

import stream_vips.cli as cli
from stream_vips.cli import config_cmd

KAFKA_SOURCE = """
source:
  type: kafka
  bootstrap_servers: "kafka:9092"
  topics: events
  security_protocol: SASL_SSL
  sasl_mechanism: SCRAM-SHA-512
  sasl_username: reader
  sasl_password: hunter2-in-the-file
  ssl_keyfile: /etc/kafka/client.key
"""


def test_yaml_shows_an_env_override_and_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STREAM_VIPS__PRIVACY__EPSILON", "3.5")
    monkeypatch.setenv("STREAM_VIPS__SAMPLING__BATCH_SIZE", "250")
    assert cli.main(["config"]) == 0
    out = capsys.readouterr().out
    data = yaml.safe_load(out)
    assert data["privacy"]["epsilon"] == 3.5 and data["sampling"]["batch_size"] == 250
    assert data["privacy"]["delta"] == 1e-5  # untouched defaults are there too
    assert "# override from the environment: privacy.epsilon = 3.5 (STREAM_VIPS__PRIVACY__EPSILON)" in out


def test_json_is_the_same_configuration(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STREAM_VIPS__MODEL__ID", "from-env")
    config = tmp_path / "c.yaml"
    config.write_text("model: {family: linreg, id: from-file, params: {dim: 2}}\n")
    assert cli.main(["config", "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["id"] == "from-env" and data["model"]["params"]["dim"] == 2


def test_passwords_are_redacted_from_the_file_the_environment_and_the_comments(tmp_path, monkeypatch, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(KAFKA_SOURCE)
    monkeypatch.setenv("STREAM_VIPS__SINK__TYPE", "kafka")
    monkeypatch.setenv("STREAM_VIPS__SINK__BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setenv("STREAM_VIPS__SINK__SASL_PASSWORD", "hunter2-in-an-override")
    monkeypatch.setenv("STREAM_VIPS_KAFKA_SASL_PASSWORD", "hunter2-in-the-fallback")
    for extra in ([], ["--json"]):
        assert cli.main(["config", "--config", str(config), *extra]) == 0
        out = capsys.readouterr().out
        assert "hunter2" not in out
        data = json.loads(out) if extra else yaml.safe_load(out)
        assert data["source"]["sasl_password"] == "<redacted>" == data["sink"]["sasl_password"]
        assert data["source"]["sasl_username"] == "reader"  # not a secret
        assert data["source"]["ssl_keyfile"] == "/etc/kafka/client.key"  # where a secret is, not the secret
    assert cli.main(["config", "--config", str(config)]) == 0
    assert "STREAM_VIPS_KAFKA_SASL_PASSWORD=<redacted>" in capsys.readouterr().out


def test_redact_covers_every_depth_and_keeps_unset_secrets_visible():
    data = {"a": {"b": [{"api_key": "k", "token": "t", "name": "n"}], "client_secret": "s", "password": None},
            "keyfile": "/x", "monkey": "m", "key": "v", "max_records_per_key": 3}
    assert config_cmd.redact(data) == {
        "a": {"b": [{"api_key": "<redacted>", "token": "<redacted>", "name": "n"}], "client_secret": "<redacted>",
              "password": None},
        "keyfile": "/x", "monkey": "m", "key": "<redacted>", "max_records_per_key": 3}  # a count, shown


def test_bad_configuration_is_exit_2_naming_the_key(monkeypatch, capsys):
    monkeypatch.setenv("STREAM_VIPS__PRIVACY__EPSILOM", "2")
    assert cli.main(["config"]) == 2
    err = capsys.readouterr().err
    assert "privacy.epsilom" in err and err.count("\n") == 1
