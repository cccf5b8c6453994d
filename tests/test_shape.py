"""The shape of the code is checked, not hoped for: the import contracts in pyproject.toml hold
(import-linter) and a contract broken on purpose is caught, ruff and mypy are clean with the
configuration in pyproject.toml (mypy's ``files``: the core, the models, privacy, fit and the
formats), and a module past 600 lines says why in its docstring."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the length past which a module's docstring says why it is one module (a paragraph "Length: ...")
LONG_MODULE = 600


def tool(name: str) -> str:
    """The dev extra's command ``name``; its absence is a failure, not a skip (CI installs it)."""
    path = shutil.which(name)
    assert path is not None, f"{name} is not installed: pip install -e '.[dev]'"
    return path


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the tree at ``root`` (its pyproject.toml, its packages first on the path)."""
    env = {"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    return subprocess.run([tool("lint-imports"), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


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


def test_ruff_is_clean():
    proc = subprocess.run([tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_is_clean_on_the_checked_packages(tmp_path):
    """mypy over pyproject's ``files``; the core, models, privacy and fit are among them."""
    import tomllib

    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    for package in ("stream_vips/core", "stream_vips/privacy"):
        assert package in files
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Success" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_a_long_module_says_why_it_is_one_module():
    long = {}
    for path in sorted([*(ROOT / "stream_vips").rglob("*.py"), *(ROOT / "connectors").rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > LONG_MODULE:
            doc = ast.get_docstring(ast.parse(text)) or ""
            long[str(path.relative_to(ROOT))] = any(p.startswith("Length:") for p in doc.split("\n\n"))
    assert all(long.values()), [p for p, ok in long.items() if not ok]
