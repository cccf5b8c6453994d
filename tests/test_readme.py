"""The README's configuration example and commands stay true."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from stream_vips.service.build import config_from_dict

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


def test_the_readme_python_example_runs():
    """The Python API block runs as written, given the data names it assumes (df, X_new)."""
    import numpy as np
    import pandas as pd

    (block,) = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 0.5, (30_000, 3))
    df = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "y": X @ np.array([0.5, -0.2, 0.1])})
    scope = {"df": df, "X_new": X[:2]}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["learner"].steps_taken == 20 and scope["mean"].shape == (2,)
    assert abs(scope["learner"].epsilon_spent - 1.0) < 0.01  # the planned steps spend the budget
