"""Break things on purpose: the replica's fault hook, and a balancer's process.

Killing is restricted to balancers on loopback URLs, found by the process listening
on that port (psutil), so a drill never signals a process on another machine or a
process it merely shares a port number with on another interface.
"""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import psutil

from ops import http_probe
from ops.drills.targets import DrillError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def set_fault(replica_url: str, mode: str, *, factor: float = 4.0, timeout: float = 5.0) -> None:
    """``POST /fault`` on an emulated replica (``sim.replica``)."""
    body = {"mode": mode, "factor": factor}
    try:
        response = http_probe.post(replica_url.rstrip("/") + "/fault", json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        raise DrillError(f"{replica_url}: fault {mode!r} not set ({exc})") from exc
    if response.status_code != 200:
        raise DrillError(f"{replica_url}: fault {mode!r} refused: HTTP {response.status_code}")


def loopback_port(url: str) -> int:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        loopback = host in LOOPBACK_NAMES or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise DrillError(f"refusing to kill a balancer at {url}: not a loopback address")
    return parts.port or (443 if parts.scheme == "https" else 80)


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    command: str


def find_listener(port: int) -> int | None:
    """The pid listening on ``port`` on a loopback or wildcard address, if any."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        address = ipaddress.ip_address(conn.laddr.ip)
        if (address.is_loopback or address.is_unspecified) and conn.pid:
            return int(conn.pid)
    return None


def listening_pid(port: int) -> int:
    pid = find_listener(port)
    if pid is None:
        raise DrillError(f"no process of ours listens on loopback port {port}")
    return pid


def kill_balancer(url: str) -> KilledProcess:
    """SIGKILL the process serving ``url``: a crash, no graceful shutdown."""
    pid = listening_pid(loopback_port(url))
    if pid == os.getpid():
        raise DrillError("refusing to kill this very process")
    process = psutil.Process(pid)
    command = " ".join(process.cmdline())
    process.kill()
    # Its parent reaps it (a supervisor restarts it); we only wait for the port to close.
    deadline = time.monotonic() + 10
    while find_listener(loopback_port(url)) == pid and time.monotonic() < deadline:
        time.sleep(0.05)
    return KilledProcess(pid, command)
