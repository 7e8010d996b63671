"""Start real processes on loopback ports for integration tests, and stop them all."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from ops import http_probe

REPO_ROOT = Path(__file__).resolve().parents[2]


# Ports are drawn below the kernel's ephemeral range: ports the OS hands to outgoing
# connections (this process's HTTP and Redis clients) can never collide with them.
_PORT_RANGE = (20000, 32000)
_rng = random.Random(os.getpid() ^ time.time_ns())
_handed_out: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_run(count: int) -> int:
    """A base port such that ``base .. base + count - 1`` are all free right now."""
    for _ in range(200):
        base = _rng.randrange(_PORT_RANGE[0], _PORT_RANGE[1] - count)
        run = range(base, base + count)
        if not _handed_out.intersection(run) and all(_bindable(p) for p in run):
            _handed_out.update(run)
            return base
    raise RuntimeError(f"no run of {count} free ports in {_PORT_RANGE}")


def free_port() -> int:
    return free_port_run(1)


def wait_http(
    url: str, *, timeout: float = 20.0, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until ``url`` answers any HTTP status (the server is listening)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            http_probe.get(url, timeout=1.0)
            return
        except httpx.HTTPError as exc:
            last = exc
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


class ProcessGroup:
    """Child processes started by one test or fixture; ``stop_all`` ends every one."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session, logging to ``<log_dir>/<name>.log``.

        ``cwd`` is the repository unless told: a program from another environment (a
        real engine) must not find this repository's packages on its path."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.processes.append(process)
        return process

    def python(
        self, name: str, *args: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        return self.start(name, [sys.executable, *args], env=env)

    def log_of(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            # The leader gone, what it forked may not be (a Celery worker's pool or
            # beat outlived a warm shutdown and ran on after the suite): end its group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        self.processes.clear()
