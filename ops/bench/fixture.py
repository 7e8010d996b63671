"""The proxy benchmark's own loopback stack: zero-compute replicas and the balancer(s).

``BenchFixture.start`` brings up, in order:

1. the emulated replicas, ``python -m sim.serve --profile zero``, split over two
   processes so that the backends are not one event loop (and are given room:
   the batch and cache limits are far above what the benchmark sends, so a
   replica never queues);
2. a throwaway SQLite database in a temporary directory with the topology rows
   (``ops.bench.seed``);
3. one balancer process per ASGI server asked for, all running the very same
   ``meridian.asgi:application`` as the same balancer (they share its rows, so
   they never forward to each other), then waits until each reports every
   replica healthy, i.e. the topology is loaded and the probes are running.
   With a base tree (another checkout, e.g. the commit before a change) each
   server also runs once from that tree, labelled ``<server>@base``, so a
   change is measured before and after in the same run.

Every child lives in its own session and ``stop`` ends each one (SIGTERM, then
SIGKILL); ``start`` stops what it started if anything fails half-way.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from django.conf import settings

from ops import http_probe
from ops.bench.seed import SeedSpec
from ops.stack.plan import GUARDED_HTTP
from ops.stack.readiness import StartupError, wait_until_answering
from ops.stack.supervisor import Child, ChildSpec, Supervisor, python_argv, tail

HOST = "127.0.0.1"
MODEL = "meridian-bench"
BALANCER = "bench-balancer"
SERVERS = ("daphne", "uvicorn")
# Also accepted by server_argv: uvicorn on asyncio's own loop, whatever is installed.
# ("uvicorn" runs uvicorn's default, --loop auto: uvloop when it can be imported.)
VARIANTS = ("uvicorn-asyncio",)
READY_TIMEOUT_S = 60.0

# Balancer settings for the bench: probes as the defaults run them; the per-replica
# cap raised so that the 128-stream phase measures the proxy, not admission control.
BALANCER_ENV = {
    "MERIDIAN_BALANCER": BALANCER,
    "MERIDIAN_REPLICA_MAX_OUTSTANDING": "1024",
    "MERIDIAN_SERVE_STATIC": "false",
    # The servers compared here play one balancer but are measured apart: not siblings.
    "MERIDIAN_SHARED_STATE": "false",
}


def server_argv(server: str, port: int) -> tuple[str, ...]:
    """The command line that serves the balancer's ASGI app on ``port`` with ``server``.

    Both servers run without access logging: the bench measures the application and
    the server, not a log file (daphne's default verbosity logs every request).
    uvicorn runs with lifespan on, as ``ops.stack.plan`` starts balancers: the runtime's
    start (``routing.lifespan``) also freezes the start-up heap and sets the young
    collection threshold, so a balancer without it is not the one that is deployed.
    (daphne gets the same start through its reactor.)
    """
    app = "meridian.asgi:application"
    if server == "daphne":
        return python_argv("-m", "daphne", "-v", "0", "-b", HOST, "-p", str(port), app)
    if server in ("uvicorn", "uvicorn-asyncio"):
        loop = "asyncio" if server == "uvicorn-asyncio" else "auto"
        return python_argv(
            "-m", "uvicorn", "--host", HOST, "--port", str(port), "--lifespan", "on",
            "--http", GUARDED_HTTP, "--loop", loop, "--no-access-log", "--log-level", "warning",
            app,
        )  # fmt: skip
    raise ValueError(f"unknown server {server!r}; expected one of {SERVERS + VARIANTS}")


@dataclass
class BenchFixture:
    """What ``start`` brought up: backend URLs, balancer URLs by server, the API key."""

    supervisor: Supervisor
    workdir: tempfile.TemporaryDirectory[str]
    # Balancers labelled "<server>@base" run from this other source tree (before/after).
    base_supervisor: Supervisor | None = None
    backends: list[str] = field(default_factory=list)
    balancers: dict[str, str] = field(default_factory=dict)
    balancer_children: dict[str, Child] = field(default_factory=dict)
    api_key: str = ""
    policy: str = ""

    @classmethod
    def start(
        cls,
        servers: list[str],
        replicas: int = 4,
        policy: str = "",
        pushing: str = "",
        base_tree: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> BenchFixture:
        workdir = tempfile.TemporaryDirectory(prefix="meridian-bench-")
        logs = Path(workdir.name) / "logs"
        fixture = cls(Supervisor(logs, Path(settings.BASE_DIR)), workdir)
        if base_tree is not None:
            fixture.base_supervisor = Supervisor(logs, base_tree.resolve())
            servers = [*servers, *(f"{server}@base" for server in servers)]
        try:
            fixture._start_replicas(replicas)
            env = {**fixture._seed(servers, policy, pushing), **(extra_env or {})}
            for server in servers:
                fixture._start_balancer(server, env)
            for server in servers:
                fixture._wait_routable(server)
        except BaseException:
            fixture.stop()
            raise
        return fixture

    def pid_of(self, server: str) -> int:
        return self.balancer_children[server].process.pid

    def stop(self) -> None:
        if self.base_supervisor is not None:
            self.base_supervisor.stop_all(grace_s=5.0)
        self.supervisor.stop_all(grace_s=5.0)
        self.workdir.cleanup()

    # -- steps -----------------------------------------------------------------------

    def _start_replicas(self, count: int) -> None:
        ports = [_free_port() for _ in range(count)]
        groups = [ports[: (count + 1) // 2], ports[(count + 1) // 2 :]]
        children = []
        for number, group in enumerate(g for g in groups if g):
            args = ["-m", "sim.serve", "--profile", "zero", "--model", MODEL, "--host", HOST,
                    "--time-scale", "1", "--max-num-seqs", "1024", "--num-blocks", "16384",
                    "--max-num-batched-tokens", "65536"]  # fmt: skip
            for port in group:
                args += ["--replica", f"bench-r{ports.index(port)}={port}"]
            children.append(
                self.supervisor.start(ChildSpec(f"replicas-{number}", python_argv(*args)))
            )
        self.backends = [f"http://{HOST}:{port}" for port in ports]
        wait_until_answering([f"{url}/health" for url in self.backends], children, timeout=30)

    def _seed(self, servers: list[str], policy: str, pushing: str) -> dict[str, str]:
        """Create the database; returns the environment every balancer process gets."""
        db = Path(self.workdir.name) / "bench.sqlite3"
        env = {
            "DJANGO_SETTINGS_MODULE": "meridian.settings",
            "DATABASE_URL": f"sqlite:///{db}",
            "MERIDIAN_VAR_DIR": self.workdir.name,
            "REDIS_URL": settings.REDIS_URL,
            **BALANCER_ENV,
        }
        self.balancers = {server: f"http://{HOST}:{_free_port()}" for server in servers}
        first_url = next(iter(self.balancers.values()))
        spec = SeedSpec(BALANCER, first_url, MODEL, self.backends, policy, pushing)
        done = subprocess.run(
            python_argv("-m", "ops.bench.seed", json.dumps(dataclasses.asdict(spec))),
            cwd=settings.BASE_DIR, env={**self.supervisor.base_env, **env},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise StartupError(f"seeding the bench database failed:\n{done.stderr[-2000:]}")
        seeded = json.loads(done.stdout.strip().splitlines()[-1])
        self.api_key, self.policy = seeded["api_key"], seeded["policy"]
        return env

    def _start_balancer(self, label: str, env: dict[str, str]) -> None:
        port = int(self.balancers[label].rsplit(":", 1)[1])
        server, _, tree = label.partition("@")
        supervisor = self.base_supervisor if tree and self.base_supervisor else self.supervisor
        spec = ChildSpec(f"balancer-{label}", server_argv(server, port), env=env)
        self.balancer_children[label] = supervisor.start(spec)

    def _wait_routable(self, server: str) -> None:
        """Until /health reports every replica healthy (topology loaded, probes answered)."""
        url, child = self.balancers[server], self.balancer_children[server]
        wait_until_answering([f"{url}/health"], [child], timeout=READY_TIMEOUT_S)
        deadline = time.monotonic() + READY_TIMEOUT_S
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = http_probe.get(f"{url}/health", timeout=2).json()
            except (httpx.HTTPError, ValueError) as exc:
                last = exc
            if isinstance(last, dict) and last.get("healthy_replicas") == len(self.backends):
                return
            time.sleep(0.2)
        raise StartupError(
            f"{server} balancer not routable after {READY_TIMEOUT_S:.0f}s ({last!r}); "
            f"log:\n{tail(child.log_path)}"
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])
