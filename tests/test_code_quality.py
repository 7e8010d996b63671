"""The style gates from STYLE.md run with the suite, so CI holds every change to them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO_ROOT


def run_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def test_ruff_finds_nothing() -> None:
    result = run_tool("ruff", "check", ".", "--output-format", "concise")
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_is_ruff_formatted() -> None:
    result = run_tool("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


# A cold cache (a fresh checkout) reads Django's stubs too: give it run_tool's limit.
@pytest.mark.timeout(300)
def test_mypy_finds_nothing() -> None:
    # The whole [tool.mypy] configuration: strict everywhere, django-stubs for the glue.
    result = run_tool("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


# Every package STYLE.md calls pure (no framework, so mypy strict needs no stubs and the
# simulator and tests run them bare).  ``workers.scaling`` is checked beside its glue in
# tests/workers/test_layers.py.
PURE = (
    "core",
    "sim.engine",
    "sim.des",
    "sim.workloads",
    "workers.costing",
    "workers.rollup_math",
    "workers.promtext",
    "console.live.snapshot",
)
FRAMEWORKS = ("django", "channels", "celery", "httpx", "redis", "daphne", "fleet")


@pytest.mark.parametrize("package", PURE)
def test_pure_package_imports_no_framework(package: str) -> None:
    code = (
        "import sys, importlib, pkgutil\n"
        f"root = importlib.import_module({package!r})\n"
        "for m in pkgutil.walk_packages(getattr(root, '__path__', []), root.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {FRAMEWORKS!r})\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
