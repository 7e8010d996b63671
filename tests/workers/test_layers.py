"""The scaling core imports no framework (the layers as a whole: tests/test_layers.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import REPO_ROOT


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
