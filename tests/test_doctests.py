"""The docstring examples are runnable (river style): every module that has one passes it."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for package in ("stream_vips", "connectors")
    for path in (ROOT / package).rglob("*.py")
    if ">>> " in path.read_text()
)


def test_the_examples_are_found():
    assert {"stream_vips.io", "stream_vips.core.data.decoding", "stream_vips.privacy.budget"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
