"""The house's layers: no module imports a package above its own, and nothing imports in a
loop.

Bottom to top (docs/architecture.md): the pure cores (``core``, ``sim``), the data
app (``fleet``), the balancer's and the control plane's glue (``routing``, ``workers``), the
operator tooling (``ops``), the console, the Django project (``meridian``).  Imports inside
functions count too: a late import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.processes import REPO_ROOT

LAYERS: dict[str, int] = {
    "core": 0,
    "sim": 0,
    "fleet": 1,
    "routing": 2,
    "workers": 2,
    "ops": 3,
    "console": 4,
    "meridian": 5,
}
PACKAGES = ("core", "routing", "sim", "fleet", "workers", "ops", "console", "meridian")


def layer_of(module: str) -> str | None:
    """The most specific layer a dotted module name belongs to."""
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
    return names


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in (REPO_ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    }


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = []
    for name, path in project_modules().items():
        own = layer_of(name)
        assert own is not None, name
        for imported in imports_of(path):
            target = layer_of(imported)
            if target is not None and LAYERS[target] > LAYERS[own]:
                upward.append(f"{name} -> {imported}")
    assert upward == []


def test_no_import_cycles() -> None:
    modules = project_modules()
    graph = {
        name: {m for m in imports_of(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []
