"""Secrets, the database and the logs under var/ are created readable by their owner only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.private_files import ensure_private, open_private_log, write_private
from ops.stack.supervisor import ChildSpec, Supervisor
from tests.support.processes import REPO_ROOT


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The usual umask, under which plain file creation gives 0644."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_new_and_loose_files_end_up_0600(tmp_path: Path, loose_umask: None) -> None:
    secret, database, log = tmp_path / "secret", tmp_path / "db.sqlite3", tmp_path / "x.log"
    write_private(secret, "s3cret")
    ensure_private(database)
    with open_private_log(log) as file:
        file.write(b"line\n")
    assert [mode(p) for p in (secret, database, log)] == [0o600] * 3
    for path in (secret, database, log):
        path.chmod(0o644)  # as an older install left them
    write_private(secret, "again")
    ensure_private(database)
    open_private_log(log).close()
    assert [mode(p) for p in (secret, database, log)] == [0o600] * 3
    assert secret.read_text() == "again" and log.read_bytes() == b"line\n"


def test_a_fresh_install_creates_its_var_files_0600(tmp_path: Path) -> None:
    var = tmp_path / "var"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "MERIDIAN_SECRET_KEY", "MERIDIAN_INTERNAL_TOKEN"}
    }
    env |= {"DJANGO_SETTINGS_MODULE": "meridian.settings", "MERIDIAN_VAR_DIR": str(var)}
    subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env,
        cwd=REPO_ROOT,
        check=True,
        preexec_fn=lambda: os.umask(0o022),
    )
    files = {
        name: mode(var / name) for name in ("secret_key", "internal_token", "meridian.sqlite3")
    }
    assert files == dict.fromkeys(files, 0o600)
    assert mode(var) == 0o700


def test_the_supervisor_writes_child_logs_0600(tmp_path: Path, loose_umask: None) -> None:
    supervisor = Supervisor(tmp_path / "logs", REPO_ROOT)
    child = supervisor.start(ChildSpec("quiet", (sys.executable, "-c", "print('hello')")))
    child.process.wait(timeout=60)
    assert mode(child.log_path) == 0o600
    assert child.log_path.read_text().strip() == "hello"
