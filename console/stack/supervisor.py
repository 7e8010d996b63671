"""Start child processes in their own process groups, watch them, and stop them all.

Every child gets its own session so that Ctrl-C in the terminal reaches only the
supervisor, which then stops the children in reverse start order (traffic first,
Redis-dependent services before Redis) with SIGTERM, then SIGKILL after a grace
period.  Output goes to one log file per child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    # Unexpected exit of an essential child is reported loudly; the demo keeps running
    # because drills kill replicas on purpose.
    essential: bool = True


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes]
    log_path: Path
    reported_exit: bool = False


class Supervisor:
    def __init__(self, log_dir: Path, cwd: Path, base_env: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        self.cwd = cwd
        self.base_env = dict(base_env if base_env is not None else os.environ)
        self.children: list[Child] = []

    def start(self, spec: ChildSpec) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{spec.name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                list(spec.argv),
                cwd=self.cwd,
                env={**self.base_env, "PYTHONUNBUFFERED": "1", **spec.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        child = Child(spec, process, log_path)
        self.children.append(child)
        return child

    def exited(self) -> list[Child]:
        """Children that exited since the last call (each reported once)."""
        newly = []
        for child in self.children:
            if not child.reported_exit and child.process.poll() is not None:
                child.reported_exit = True
                newly.append(child)
        return newly

    def stop_all(self, grace_s: float = 8.0) -> None:
        for child in reversed(self.children):
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                child.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait()
        self.children.clear()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        return


def python_argv(*args: str) -> tuple[str, ...]:
    return (sys.executable, *args)


def tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
