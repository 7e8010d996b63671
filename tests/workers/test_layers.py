"""The control plane's place in the layers: the scaling core imports no framework, and
nothing in ``workers`` imports a package above it (ops, console, the project)."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.support.processes import REPO_ROOT

ABOVE = {"ops", "console", "meridian"}


def imported_packages(source: str) -> set[str]:
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_workers_import_nothing_above_them() -> None:
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(imported_packages(path.read_text()) & ABOVE)
        for path in (REPO_ROOT / "workers").rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_scaling_core_imports_no_framework() -> None:
    code = (
        "import sys, importlib, pkgutil, workers.scaling as s\n"
        "for m in pkgutil.walk_packages(s.__path__, 'workers.scaling.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in "
        "{'django', 'channels', 'celery', 'httpx', 'redis', 'daphne', 'fleet'})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
