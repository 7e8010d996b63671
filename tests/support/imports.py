"""What a fresh interpreter imports: for tests that keep heavy packages off the paths
that do not need them (every ``manage.py`` command, the URLconf, the drill forms)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

from tests.support.processes import REPO_ROOT


def run_python(script: str, env: Mapping[str, str] | None = None) -> str:
    """Run ``script`` in a fresh interpreter at the repository root; its last output line."""
    child_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "meridian.settings", **(env or {})}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def modules_imported_by(code: str, env: Mapping[str, str] | None = None) -> set[str]:
    """Every module in ``sys.modules`` after Django is set up and ``code`` has run."""
    setup = "import json, sys, django\ndjango.setup()"
    report = "print(json.dumps(sorted(sys.modules)))"
    return set(json.loads(run_python(f"{setup}\n{code}\n{report}", env)))
