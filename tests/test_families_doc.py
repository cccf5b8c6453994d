"""docs/families.md is made from the registry (``python -m stream_vips.models --write-docs
docs/families.md``): the committed page must be the one the code gives, so each family's
records, parameters, support and fit rule are documented where the code states them."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_vips.models import MODEL_FAMILIES
from stream_vips.models.registry import families_markdown, family_section, main, parameter_docs

PAGE = Path(__file__).resolve().parents[1] / "docs" / "families.md"


def test_the_committed_families_page_is_the_one_the_registry_gives():
    assert PAGE.read_text(encoding="utf-8") == families_markdown(), (
        "docs/families.md is stale: python -m stream_vips.models --write-docs docs/families.md")


@pytest.mark.parametrize("family", list(MODEL_FAMILIES))
def test_every_family_documents_each_constructor_parameter(family):
    section = family_section(family)  # raises, naming the parameter, when one has no meaning
    assert section.startswith(f"## {family}\n") and "| parameter | default | meaning |" in section


def test_a_parameter_item_may_name_several_parameters():
    class Doc:
        """What it is.

        - ``a0``, ``b0``: shape and rate;
        - ``x_mean`` / ``x_std``: the standardisation,
          one per feature.
        """

    assert parameter_docs(Doc) == {"a0": "shape and rate", "b0": "shape and rate",
                                   "x_mean": "the standardisation, one per feature",
                                   "x_std": "the standardisation, one per feature"}


def test_the_module_writes_the_page_and_checks_it(tmp_path, capsys):
    page = tmp_path / "families.md"
    assert main(["--write-docs", str(page)]) == 0 and main(["--check", str(page)]) == 0
    page.write_text(page.read_text() + "edited by hand\n")
    assert main(["--check", str(page)]) == 1 and "is stale" in capsys.readouterr().err
