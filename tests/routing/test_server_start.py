"""Balancers start their runtime when the server starts, under both ASGI servers.

A balancer that only woke up on its first request would send no heartbeat after a
restart and look dead to peers and the failover controller until a client called it.
The argv is the one ``make run`` uses (``ops.stack.plan.balancer_argv``).
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from django.conf import settings

from core.peers import heartbeat_key
from ops import http_probe
from ops.stack.plan import BALANCER_SERVERS, balancer_argv
from tests.support.balancers import MODEL, TopologyFactory, client, metric_value, start_replicas
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port

# See test_proxy_integration.py for why django_db and not transaction=True.
pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@dataclass(frozen=True)
class Rows:
    key: str
    ports: dict[str, int]  # server → balancer port


@pytest.fixture(scope="module")
def rows(topology: TopologyFactory, module_processes: ProcessGroup) -> Iterator[Rows]:
    """One region and balancer per server, committed so the children see them."""
    replica_port = free_port()
    start_replicas(module_processes, "start", {"st-a": replica_port})
    topology.service()
    ports = {}
    for server in BALANCER_SERVERS:
        region = topology.region(f"st-{server}")
        ports[server] = free_port()
        topology.balancer(f"st-{server}-lb", region, ports[server])
        topology.replica(f"st-{server}-a", region, replica_port)
    yield Rows(topology.api_key("start"), ports)


@pytest.mark.parametrize("server", BALANCER_SERVERS)
def test_balancer_heartbeats_before_any_request_and_stops_cleanly(
    server: str, rows: Rows, child_env: dict[str, str], processes: ProcessGroup
) -> None:
    name, port = f"st-{server}-lb", rows.ports[server]
    env = {**child_env, "MERIDIAN_BALANCER": name, "MERIDIAN_HEARTBEAT_INTERVAL_S": "0.2"}
    process = processes.start(name, balancer_argv(server, "127.0.0.1", port), env=env)

    beats = redis.Redis.from_url(settings.REDIS_URL)
    try:
        eventually(lambda: beats.get(heartbeat_key(name)) is not None, what="first heartbeat")
    finally:
        beats.close()

    reply = client(f"http://127.0.0.1:{port}", rows.key).completions.create(
        model=MODEL, prompt="started early", max_tokens=2
    )
    assert reply.choices[0].text
    # uvicorn runs the balancer on uvloop (a dependency, --loop auto); daphne's Twisted
    # reactor runs on asyncio's own loop.
    event_loop = "uvloop" if server == "uvicorn" else "asyncio"
    info = f'meridian_balancer_info{{balancer="{name}",event_loop="{event_loop}"}}'
    assert metric_value(f"http://127.0.0.1:{port}", info) == 1.0
    # A balancer's port serves the data plane only: no admin login, no console.
    for path in ("/admin/login/", "/console/charts"):
        assert http_probe.get(f"http://127.0.0.1:{port}{path}").status_code == 404
    process.send_signal(signal.SIGTERM)
    # uvicorn shuts down gracefully, then re-raises the signal it caught (exit -15).
    try:
        code = process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} did not stop within 20 s of SIGTERM:\n{processes.log_of(name)}")
    assert code in (0, -signal.SIGTERM)
    if server == "uvicorn":
        assert "Application shutdown complete" in processes.log_of(name)
