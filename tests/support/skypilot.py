"""SkyPilot's own environment for the tests that run its SDK (``ops/install_skypilot.sh``)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.processes import REPO_ROOT

INSTALLER = REPO_ROOT / "ops" / "install_skypilot.sh"


def sky_python() -> str:
    found = subprocess.run([str(INSTALLER), "--where"], capture_output=True, text=True)
    python = found.stdout.strip()
    if found.returncode != 0 or not python:
        note = f"SkyPilot's environment is not installed ({INSTALLER.name} installs it)"
        if os.environ.get("CI"):
            pytest.fail(note)
        pytest.skip(note)
    return python
