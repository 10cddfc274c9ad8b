"""The package's layout holds: imports run one way (no cycle, nothing imports the plugin's face
from below), no module grows past 600 lines, and every folder says what it owns."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_attnperf"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()
PLUGINS = {name for name in MODULES if name.startswith("pytest_attnperf.plugins.")}  # the run's plugin objects
# the plugin's face, and the modules allowed to import each of its parts
FACE = {
    "pytest_attnperf.plugin": set(),
    "pytest_attnperf.fixture": {"pytest_attnperf.plugin", *PLUGINS},
    "pytest_attnperf.session": {"pytest_attnperf.plugin", "pytest_attnperf.fixture", *PLUGINS},
}


def _targets(name: str, node: ast.AST) -> list[str]:
    """The package's modules an import statement in module ``name`` names."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = name.split(".") if MODULES[name].name == "__init__.py" else name.split(".")[:-1]
            here = here[: len(here) - node.level + 1]
            base = ".".join([*here, *([node.module] if node.module else [])])
        wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    else:
        return []
    out = []
    for target in wanted:
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target and target != name and MODULES[target].name != "__init__.py":
            out.append(target)
    return out


def _graph() -> dict[str, set[str]]:
    return {name: {t for node in ast.walk(ast.parse(path.read_text())) for t in _targets(name, node)}
            for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_nothing_imports_the_plugins_face_from_below() -> None:
    graph = _graph()
    wrong = [f"{importer} imports {face}" for face, allowed in FACE.items()
             for importer, targets in graph.items() if face in targets and importer not in allowed]
    assert wrong == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_the_limit(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name}: {lines} lines"


@pytest.mark.parametrize("folder", sorted({p.parent for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}))
def test_every_folder_says_what_it_owns(folder: Path) -> None:
    init = folder / "__init__.py"
    assert init.exists(), f"{folder} has no __init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc, f"{init} has no docstring"
