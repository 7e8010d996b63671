"""Start child processes in their own process groups, watch them, and stop them all.

Every child gets its own session so that Ctrl-C in the terminal reaches only the
supervisor, which then stops the children in reverse start order (traffic first,
Redis-dependent services before Redis) with SIGTERM, then SIGKILL after a grace
period.  Output goes to one log file per child.

A child whose spec says ``restart`` is started again when it exits unexpectedly,
after a backoff that doubles per attempt, at most ``RestartPolicy.attempts`` times
in a row (a child that stayed up ``stable_s`` starts counting afresh).  The demo
restarts balancers, the console and Celery this way, so a balancer killed by a
drill comes back and its replicas are handed back (SkyLB §4.2's recovery process);
replicas are not restarted, because drills kill those on purpose.
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

from fleet.private_files import open_private_log


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    # Unexpected exit of an essential child is reported loudly; the demo keeps running
    # because drills kill replicas on purpose.
    essential: bool = True
    # Start it again when it exits (RestartPolicy says how soon and how often).
    restart: bool = False


@dataclass(frozen=True)
class RestartPolicy:
    attempts: int = 5
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    # A child that ran this long since its last start has its attempts counted afresh.
    stable_s: float = 60.0

    def delay(self, attempt: int) -> float:
        """Wait before restart number ``attempt`` (1-based): backoff doubling, capped."""
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes]
    log_path: Path
    reported_exit: bool = False
    started_at: float = field(default_factory=time.monotonic)
    restarts: int = 0  # consecutive restarts (reset once the child has been stable)
    restart_at: float | None = None  # when a pending restart is due


class Supervisor:
    def __init__(
        self,
        log_dir: Path,
        cwd: Path,
        base_env: Mapping[str, str] | None = None,
        restart_policy: RestartPolicy | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.cwd = cwd
        self.base_env = dict(base_env if base_env is not None else os.environ)
        self.restart_policy = restart_policy or RestartPolicy()
        self.children: list[Child] = []

    def _spawn(self, spec: ChildSpec) -> tuple[subprocess.Popen[bytes], Path]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{spec.name}.log"
        with open_private_log(log_path) as log:
            process = subprocess.Popen(
                list(spec.argv),
                cwd=self.cwd,
                env={**self.base_env, "PYTHONUNBUFFERED": "1", **spec.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return process, log_path

    def start(self, spec: ChildSpec) -> Child:
        process, log_path = self._spawn(spec)
        child = Child(spec, process, log_path)
        self.children.append(child)
        return child

    def exited(self) -> list[Child]:
        """Children that exited since the last call (each reported once); those whose
        spec says ``restart`` get a restart scheduled if attempts remain."""
        newly = []
        now = time.monotonic()
        for child in self.children:
            if not child.reported_exit and child.process.poll() is not None:
                child.reported_exit = True
                self._schedule_restart(child, now)
                newly.append(child)
        return newly

    def _schedule_restart(self, child: Child, now: float) -> None:
        if not child.spec.restart:
            return
        policy = self.restart_policy
        if now - child.started_at >= policy.stable_s:
            child.restarts = 0
        if child.restarts < policy.attempts:
            child.restart_at = now + policy.delay(child.restarts + 1)

    def restart_due(self) -> list[Child]:
        """Start again every child whose restart is due; returns them."""
        now = time.monotonic()
        restarted = []
        for child in self.children:
            if child.restart_at is None or child.restart_at > now:
                continue
            child.process, child.log_path = self._spawn(child.spec)
            child.restarts += 1
            child.started_at, child.restart_at, child.reported_exit = now, None, False
            restarted.append(child)
        return restarted

    def gave_up(self, child: Child) -> bool:
        """True when an exited restartable child will not be started again.  Only an exit
        ``exited`` has handled counts: until then no restart is scheduled for it yet, and
        a child that died a moment ago would read as given up."""
        return child.spec.restart and child.reported_exit and child.restart_at is None

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
