"""The shape of the code is checked, not hoped for: the import contracts in pyproject.toml hold
(import-linter), and a contract broken on purpose is caught."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports")
pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter is not installed (pip install -e '.[dev]')")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the tree at ``root`` (its pyproject.toml, its packages first on the path)."""
    env = {"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    return subprocess.run([LINT, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_every_import_contract_holds():
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "BROKEN" not in proc.stdout and "Contracts: " in proc.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("stream_vips/core/engine.py", "import stream_vips.service.app", "never import the service"),
    ("stream_vips/privacy/budget.py", "import stream_vips.core.learner", "is layered"),
    ("connectors/memory.py", "import stream_vips.core.learner", "never reach into the core"),
    ("stream_vips/service/app.py", "import connectors.jsonl", "only the service's build module"),
    ("connectors/kafka/errors.py", "import connectors.kafka.source", "Kafka connectors are layered"),
])
def test_a_contract_broken_on_purpose_fails(tmp_path, module, line, contract):
    """Each contract can fail: one import added against it, in a copy of the tree."""
    copy = tmp_path / "tree"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "lib", "cache", "*.pyc", "__pycache__",
                                                              "results", "golden", "tools"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}  # against the contract\n")
    proc = lint_imports(copy)
    assert proc.returncode != 0
    broken = proc.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, proc.stdout[-3000:]
