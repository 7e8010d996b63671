"""Peer routers for ``manage.py bench proxy --peers``: vllm-router and sglang-router.

Both are Rust routers published on the package registry as Python wheels.  Neither
is a dependency of Meridian: each is installed on demand into its own virtual
environment in the user's cache directory
(``${XDG_CACHE_HOME:-~/.cache}/meridian/routers/<package>-<version>``), once per
user and machine, like the engine environments of the engine tests.  A stamp
written after the router's executable answered ``--help`` marks an install done;
a file lock makes two clones that install at once take turns.  When an install
fails (no registry, no wheel for this platform), the router is skipped with a
note instead of failing the benchmark.

Each router is started in front of the same backends as Meridian's balancer, with
its health checks left at their defaults and its logging at ``error``:

* vllm-router with ``round_robin`` (what the issue measured it with);
* sglang-router with ``cache_aware``, its prefix-aware policy, the same kind of
  work as Meridian's ``skylb``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ops import http_probe
from ops.stack.readiness import StartupError

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
INSTALL_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """One peer router: its package, pinned version, executable and command line."""

    name: str  # the label in the benchmark's table
    package: str
    version: str
    executable: str
    subcommand: tuple[str, ...]
    policy: str

    def argv(self, executable: Path, port: int, backends: list[str]) -> list[str]:
        return [
            str(executable), *self.subcommand, "--host", HOST, "--port", str(port),
            "--worker-urls", *backends, "--policy", self.policy,
            # Both default to one fixed metrics port, which two routers cannot share.
            "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
            "--log-level", "error",
        ]  # fmt: skip


PEERS: tuple[PeerSpec, ...] = (
    PeerSpec("vllm-router", "vllm-router", "0.1.17", "vllm-router", (), "round_robin"),
    PeerSpec("sglang-router", "sglang-router", "0.3.2", "sglang-router", ("launch",),
             "cache_aware"),
)  # fmt: skip


@dataclass(slots=True)
class Installed:
    """Where each peer's executable is, and why the others are not there."""

    executables: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def env_dir(spec: PeerSpec, cache_home: Path | None = None) -> Path:
    """The virtual environment that holds ``spec``'s router."""
    base = cache_home or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "meridian" / "routers" / f"{spec.package}-{spec.version}"


def install(spec: PeerSpec, cache_home: Path | None = None, python: str = "") -> Path:
    """The router's executable, installed first unless its stamp is there.

    Raises ``StartupError`` with pip's last lines when the install fails.
    """
    directory = env_dir(spec, cache_home)
    executable, stamp = directory / "bin" / spec.executable, directory / ".meridian-installed"
    if stamp.is_file():
        return executable
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{directory}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another clone installing: wait for it
        if stamp.is_file():
            return executable
        subprocess.run(["rm", "-rf", str(directory)], check=True)  # a half-made one
        steps = [
            [python or sys.executable, "-m", "venv", str(directory)],
            [str(directory / "bin" / "python"), "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", f"{spec.package}=={spec.version}"],
            [str(executable), *spec.subcommand, "--help"],
        ]  # fmt: skip
        for argv in steps:
            try:
                done = subprocess.run(argv, capture_output=True, text=True,
                                      timeout=INSTALL_TIMEOUT_S, check=False)  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise StartupError(f"{' '.join(argv[:4])} failed: {exc}") from exc
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()[-5:]
                raise StartupError(f"{' '.join(argv[:4])} failed: " + " / ".join(lines))
        stamp.write_text(f"{spec.package}=={spec.version}\n")
    return executable


def install_all(specs: tuple[PeerSpec, ...] = PEERS, cache_home: Path | None = None) -> Installed:
    """Install what can be; a router that cannot is left out with a note saying why."""
    installed = Installed()
    for spec in specs:
        try:
            installed.executables[spec.name] = install(spec, cache_home)
        except (StartupError, OSError, subprocess.TimeoutExpired) as exc:
            installed.notes.append(f"{spec.name} {spec.version} skipped: {exc}")
    return installed


@dataclass(slots=True)
class RunningPeer:
    name: str
    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def running_peers(
    installed: Installed, backends: list[str], log_dir: Path
) -> Iterator[list[RunningPeer]]:
    """Start every installed peer in front of ``backends``; stop them all on exit."""
    peers: list[RunningPeer] = []
    try:
        for spec in PEERS:
            executable = installed.executables.get(spec.name)
            if executable is None:
                continue
            port = free_port()
            log_dir.mkdir(parents=True, exist_ok=True)
            with open(log_dir / f"{spec.name}.log", "wb") as log:
                process = subprocess.Popen(
                    spec.argv(executable, port, backends), stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            peer = RunningPeer(spec.name, f"http://{HOST}:{port}", process)
            peers.append(peer)
            wait_ready(peer, log_dir / f"{spec.name}.log")
        yield peers
    finally:
        for peer in reversed(peers):
            stop(peer.process)


def wait_ready(peer: RunningPeer, log_path: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until the router answers ``/health`` with 200 (its workers checked)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if peer.process.poll() is not None:
            log = log_path.read_text(errors="replace")[-1500:]
            raise StartupError(f"{peer.name} exited with {peer.process.returncode}:\n{log}")
        # Refused while it starts: not up yet, ask again.
        with contextlib.suppress(httpx.HTTPError):
            if http_probe.get(f"{peer.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise StartupError(f"{peer.name} did not answer on {peer.url} within {timeout_s:.0f}s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])
