"""The Kafka connector package is layered: its modules import each other without a cycle, and no
private name (a leading underscore) is imported from one module into another.

The graph counts every import, at module level and inside functions alike (a lazy import is still
a dependency), read from the source with :mod:`ast` rather than by importing anything. The layer
order it allows is written down in docs/architecture.md's connectors map.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "connectors.kafka"


def module_name(path: Path, package: str = PACKAGE) -> str:
    return package if path.stem == "__init__" else f"{package}.{path.stem}"


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def import_graph(directory: Path, package: str = PACKAGE) -> tuple[dict[str, set[str]], list[str]]:
    """``({module: modules it imports}, [private names crossing a module boundary])`` for the
    package in ``directory``, at every nesting level of the source."""
    paths = sorted(directory.glob("*.py"))
    modules = {module_name(p, package) for p in paths}
    graph: dict[str, set[str]] = {}
    crossings: list[str] = []
    for path in paths:
        importer = module_name(path, package)
        is_package = path.stem == "__init__"
        edges = graph.setdefault(importer, set())
        aliases: dict[str, str] = {}  # a local name bound to one of the package's modules
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = next((m for m in sorted(modules, key=len, reverse=True)
                                   if alias.name == m or alias.name.startswith(m + ".")), None)
                    if target is not None:
                        edges.add(target)
                        if alias.asname:
                            aliases[alias.asname] = target
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, importer, is_package)
                if source not in modules:
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules:
                        edges.add(submodule)
                        aliases[alias.asname or alias.name] = submodule
                        continue
                    edges.add(source)
                    if _private(alias.name) and source != importer:
                        crossings.append(f"{importer} imports {alias.name} from {source}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and _private(node.attr) and aliases[node.value.id] != importer):
                crossings.append(f"{importer} uses {aliases[node.value.id]}.{node.attr}")
        edges.discard(importer)
    return graph, crossings


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that lies on one (depth-first search), as module paths."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, path + [node])
        done.add(node)

    for start in sorted(graph):
        visit(start, [])
    return found


def test_the_graph_sees_the_package():
    graph, _ = import_graph(ROOT / "connectors" / "kafka")
    assert {"connectors.kafka", "connectors.kafka.source", "connectors.kafka.clients"} <= set(graph)
    assert "connectors.kafka.source" in graph["connectors.kafka"]


def test_no_import_cycle_in_the_kafka_package():
    graph, _ = import_graph(ROOT / "connectors" / "kafka")
    assert cycles(graph) == []


def test_no_private_name_crosses_a_kafka_module_boundary():
    _, crossings = import_graph(ROOT / "connectors" / "kafka")
    assert crossings == []


def test_the_checks_catch_a_cycle_and_a_private_import(tmp_path):
    (tmp_path / "__init__.py").write_text("from pkg.a import A\n")
    (tmp_path / "a.py").write_text("from pkg.b import _helper\nA = 1\n")
    (tmp_path / "b.py").write_text("def _helper():\n    from pkg import a\n    return a._secret\n")
    graph, crossings = import_graph(tmp_path, "pkg")
    assert ["pkg.a", "pkg.b", "pkg.a"] in cycles(graph)
    assert sorted(crossings) == ["pkg.a imports _helper from pkg.b", "pkg.b uses pkg.a._secret"]


def test_production_code_imports_no_private_kafka_name():
    """Nothing outside the package (the service, the CLI) reaches a private name of it either."""
    found = []
    for path in sorted((ROOT / "stream_vips").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
                found += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if _private(a.name)]
    assert found == []
