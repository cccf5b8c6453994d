"""The model families: one line per family, naming the module that defines it.

A family is its module: the :class:`~stream_vips.models.base.Model` subclass there carries
everything the rest of the package knows about the family (its records, parameters, fit rule,
synthetic data, demo, audit pair and report summary; see :mod:`stream_vips.models.base`). Adding a
family is its module, one line in :data:`MODEL_FAMILIES`, its tests and the regenerated
docs/families.md (``python -m stream_vips.models --write-docs docs/families.md``). This module
imports no family until one is asked for, so command-line help can list the families without
loading numpy or scipy.

>>> model_class("linreg").__name__
'LinearRegression'
>>> dimension("sbn")
('y', 'n_visible')
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from stream_vips.errors import ConfigError

if TYPE_CHECKING:
    import inspect
    from types import ModuleType

    from stream_vips.models.base import Model

#: Model families: name -> module defining exactly one Model subclass with that ``family``.
MODEL_FAMILIES: dict[str, str] = {
    "linreg": "stream_vips.models.linreg",
    "logistic": "stream_vips.models.logistic",
    "lda": "stream_vips.models.lda",
    "sbn": "stream_vips.models.sbn",
    "sep_mixture": "stream_vips.models.sep.mixture",
    "sep_probit": "stream_vips.models.sep.probit",
    "sep_bnn": "stream_vips.models.sep.bnn",
    "dpvi": "stream_vips.models.baselines.dpvi",
    "sgld": "stream_vips.models.baselines.sgld",
    "ops": "stream_vips.models.baselines.ops",
}


def model_class(family: str) -> type[Model]:
    """The Model subclass registered for ``family`` (imported on first use)."""
    from stream_vips.models.base import Model

    if family not in MODEL_FAMILIES:
        raise ConfigError(f"model.family: unknown family {family!r} (known: {', '.join(sorted(MODEL_FAMILIES))})")
    module = importlib.import_module(MODEL_FAMILIES[family])
    found = [obj for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, Model) and getattr(obj, "family", None) == family]
    if len(found) != 1:
        raise ConfigError(f"model.family: module {module.__name__} defines {len(found)} models of family {family!r}")
    return found[0]


def dimension(family: str) -> tuple[str, str]:
    """(record field, model parameter) of a family's public dimension d."""
    cls = model_class(family)
    return cls.record_field, cls.dim_param


# ------------------------------------------------------------------------------ docs/families.md

class _Example(TypedDict):
    n: int
    d: int
    epsilon: float
    delta: float


#: The public quantities docs/families.md shows each fit rule at.
DOCS_EXAMPLE: _Example = {"n": 10_000, "d": 20, "epsilon": 1.0, "delta": 1e-5}


def _markdown(text: str, module: ModuleType | None = None) -> str:
    """RST roles and literals as Markdown code (``~a.b`` shows as ``b``); a ``:data:`` constant of
    ``module`` shows its value."""

    def role(m: re.Match[str]) -> str:
        kind, target = m.group(1), m.group(2)
        name = target.lstrip("~").split(".")[-1] if target.startswith("~") else target
        value = getattr(module, target, None) if kind == "data" and module is not None else None
        return f"`{name}` = {value}" if isinstance(value, (int, float)) else f"`{name}`"

    return re.sub(r":([a-z]+):`([^`]+)`", role, text).replace("``", "`")


def _first_paragraph(obj: object) -> str:
    """The first paragraph of ``obj``'s docstring, joined into one line."""
    import inspect

    doc = inspect.getdoc(obj)
    if doc is None:
        raise ValueError(f"{obj!r} has no docstring for docs/families.md")
    blocks = doc.strip().split("\n\n")
    return [" ".join(line.strip() for line in block.splitlines()) for block in blocks if block.strip()][0]


def parameter_docs(cls: type) -> dict[str, str]:
    """Each constructor parameter's meaning, from the ``- ``name``: meaning`` items of the class's
    docstring and its bases' (a parameter may share an item with others: ``a0``, ``b0``: ...)."""
    import inspect

    out: dict[str, str] = {}
    for klass in cls.__mro__:
        doc = inspect.getdoc(klass) if "__doc__" in vars(klass) else None
        item: list[str] = []
        for line in (doc or "").splitlines() + [""]:
            if item and (line.startswith("- ") or not line.startswith("  ")):
                head, _, meaning = " ".join(item).partition(": ")
                for name in re.findall(r"``(\w+)``", head):
                    out.setdefault(name, meaning.rstrip(";.").strip())
                item = []
            if line.startswith("- ``"):
                item = [line[2:]]
            elif item:
                item.append(line.strip())
    return out


def _default(parameter: inspect.Parameter) -> str:
    import inspect
    import json

    if parameter.default is inspect.Parameter.empty:
        return "required"
    try:
        return f"`{json.dumps(parameter.default)}`"
    except TypeError:
        return f"`{parameter.default!r}`"


def _dimension(cls: type[Model]) -> str:
    if cls.dimension_of is not None:
        return f"d is the size of `{cls.dim_param}`, which fit needs"
    return f"d is the length of `{cls.record_field}` (the parameter `{cls.dim_param}`)"


def _support(cls: type[Model]) -> list[str]:
    engine = cls.engine_refusal
    key = "yes" if cls.supports_key_unit else f"no: {cls.key_unit_note}"
    audit = cls.audit()
    if isinstance(audit, str):
        audited = f"no: {audit}"
    else:
        audited = (f"its worst candidate pair reaches at least {audit.ratio_floor:g} of the claimed sensitivity "
                   f"({audit.floor_reason})")
    return [f"- **Fit and stream** (`stream-vips fit`, `stream_vips.fit`, `stream-vips run`): "
            f"{'yes' if engine is None else 'no: ' + engine}",
            f"- **Key-level privacy** (`privacy.unit: key`): {key}",
            f"- **Demo** (`stream-vips demo --family {cls.family}`): {cls.demo.about if cls.demo else 'none'}",
            f"- **Audit**: {_markdown(audited)}",
            f"- **Regime warning** (`fit`, the estimators): {_regime(cls)}"]


def _regime(cls: type[Model]) -> str:
    """The family's ``regime_warning`` rule (its docstring's first paragraph), or that it has none."""
    from stream_vips.models.base import Model as Base

    if cls.regime_warning.__func__ is Base.regime_warning.__func__:  # type: ignore[attr-defined]
        return ("none stated: the family's module names no regime where a benchmark found it learns little "
                "(docs/fit.md lists the evidence per family), so `fit` says nothing (the hook returns None)")
    return _markdown(_first_paragraph(cls.regime_warning), sys.modules[cls.__module__])


def _fit_rule(cls: type[Model]) -> list[str]:
    if cls.engine_refusal is not None:
        return []
    ex = DOCS_EXAMPLE
    s = cls.fit_rule(ex["n"], ex["d"], ex["epsilon"], ex["delta"], False)
    shown = {k: v for k, v in s.model_params.items() if k not in ("dataset_size", cls.dim_param)}
    params = ", ".join(f"`{k}` = {v:.4g}" if isinstance(v, float) else f"`{k}` = {v}" for k, v in shown.items())
    weights = "the family's default" if s.block_weights is None else \
        ", ".join(f"{k} {v:g}" for k, v in s.block_weights.items())
    example = (f"At N = {ex['n']:,}, d = {ex['d']}, epsilon {ex['epsilon']:g}, delta {ex['delta']:g}: Poisson rate "
               f"q = {s.q:.4g}, {s.steps} step{'s' if s.steps != 1 else ''}, rho_t = ({s.tau0:g} + t)^-{s.kappa:g}, "
               f"noise allocation {weights}, the {s.accountant} accountant"
               + (f"; model parameters {params}" if params else "") + ".")
    module = sys.modules[cls.__module__]
    return ["", "### Fit rule", "", _markdown(_first_paragraph(cls.fit_rule), module), "", example]


def family_section(family: str) -> str:
    """The docs/families.md section of ``family``: what it is, its records, what it supports, every
    constructor parameter with its default and meaning, and its fit rule."""
    import inspect

    cls = model_class(family)
    meanings = parameter_docs(cls)
    rows = []
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self":
            continue
        if name not in meanings:
            raise ValueError(f"{cls.__name__}'s docstring does not document its parameter {name!r}")
        rows.append(f"| `{name}` | {_default(parameter)} | {_markdown(meanings[name]).replace('|', chr(92) + '|')} |")
    lines = [f"## {family}", "", _markdown(_first_paragraph(cls)), "",
             f"- **Model**: `{cls.__module__}.{cls.__name__}`",
             f"- **Records**: `{cls.record_format}`; {_dimension(cls)}",
             *_support(cls), "", "### Parameters", "", "| parameter | default | meaning |", "|---|---|---|", *rows,
             *_fit_rule(cls)]
    return "\n".join(lines) + "\n"


def families_markdown() -> str:
    """docs/families.md: every registered family's section, in registry order."""
    head = ["# Model families", "",
            "Generated from the registry (`stream_vips/models/registry.py`) and each family's module by "
            "`python -m stream_vips.models --write-docs docs/families.md`; do not edit by hand "
            "(tests/test_families_doc.py checks that it is current). A family is its module: the "
            "hooks of `stream_vips.models.base.Model` state its records, parameters, fit rule, synthetic "
            "data, demo, audit and report summary.", "",
            "| family | records | fit and stream | key-level privacy | demo |", "|---|---|---|---|---|"]
    for family in MODEL_FAMILIES:
        cls = model_class(family)
        fmt = cls.record_format.split(" (")[0].replace("|", "\\|")
        head.append(f"| [{family}](#{family}) | `{fmt}` | {'yes' if cls.engine_refusal is None else 'no'} | "
                    f"{'yes' if cls.supports_key_unit else 'no'} | {'yes' if cls.demo else 'no'} |")
    return "\n".join(head) + "\n\n" + "\n".join(family_section(f) for f in MODEL_FAMILIES)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stream_vips.models --write-docs PATH`` writes docs/families.md; ``--check PATH``
    exits 1 when the file differs from what the registry gives."""
    import argparse
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m stream_vips.models", description=main.__doc__)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--write-docs", metavar="PATH")
    group.add_argument("--check", metavar="PATH")
    args = p.parse_args(argv)
    text = families_markdown()
    if args.write_docs:
        Path(args.write_docs).write_text(text, encoding="utf-8")
        return 0
    if Path(args.check).read_text(encoding="utf-8") != text:
        print(f"{args.check} is stale: python -m stream_vips.models --write-docs {args.check}", file=sys.stderr)
        return 1
    return 0
