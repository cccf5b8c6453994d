"""The README's configuration example and commands stay true."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from stream_vips.config import config_from_dict

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_readme_configuration_example_is_a_valid_config():
    blocks = re.findall(r"```yaml\n(.*?)```", README, flags=re.S)
    assert blocks, "README has a YAML example"
    for block in blocks:
        cfg = config_from_dict(yaml.safe_load(block), env={})
        assert cfg.privacy.ledger.type == "kafka" and cfg.source.type == "kafka"


def test_the_two_commands_are_the_demo_and_the_ci_script():
    assert "pip install -e . && stream-vips demo" in README
    assert "bash .ci/run" in README
    assert (Path(__file__).resolve().parents[1] / ".ci" / "run").exists()
