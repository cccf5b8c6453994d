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

    (block,) = [b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "PrivateLearner" in b]
    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 0.5, (30_000, 3))
    df = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "y": X @ np.array([0.5, -0.2, 0.1])})
    scope = {"df": df, "X_new": X[:2]}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["learner"].steps_taken == 20 and scope["mean"].shape == (2,)
    assert abs(scope["learner"].epsilon_spent - 1.0) < 0.01  # the planned steps spend the budget


def test_the_readme_estimator_example_runs():
    """The estimator block runs as written on data shaped as it says (rows of norm <= 1)."""
    import numpy as np

    (block,) = [b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "train_test_split" in b]
    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 0.5, (2_000, 3)) / np.sqrt(3) * 2
    y = (X @ np.array([3.0, -2.0, 1.0]) + 0.3 * rng.logistic(size=2_000) > 0).astype(int)
    scope = {"X": X, "y": y}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["clf"].epsilon_spent_ <= 1.0 and scope["intervals"].shape == (4, 2)
    assert "bound x_bound = 1.0" in scope["clf"].report()


def test_the_readme_cli_model_is_scored(tmp_path, monkeypatch):
    """The command's example writes model.json; the block after it scores that file."""
    import json

    import numpy as np

    from stream_vips.cli import main

    (command,) = [line for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S)
                  for line in block.splitlines() if line.startswith("stream-vips fit ") and "--out model.json" in line]
    rng = np.random.default_rng(1)
    X = np.hstack([rng.uniform(-0.3, 0.3, (1_500, 9)), np.full((1_500, 1), 0.3)])
    y = (X @ rng.normal(size=10) > 0).astype(int)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"x": r.tolist(), "y": int(v)}) + "\n"
                                                 for r, v in zip(X, y)))
    assert main(command.split()[1:]) == 0
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", README, flags=re.S) if "from_message" in b]
    scope = {"X_test": X, "y_test": y}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["clf"].score(X, y) > 0.8
