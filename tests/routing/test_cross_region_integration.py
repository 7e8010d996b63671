"""Three regions like the demo, over real sockets: SkyLB's two layers (§3.1) with
SP-P availability (§3.3) exchanged over ``/internal/availability``.

``cr-us``, ``cr-eu`` and ``cr-ap`` each have one balancer (demo RTTs: us-eu 80 ms,
us-ap 180 ms, eu-ap 150 ms) and one emulated replica; the three replicas share
one ``sim.serve`` process started with ``--max-num-seqs 2``.  A region is
*saturated* by sending three slow requests straight to its replica: two run,
one waits, so the replica's own ``vllm:num_requests_waiting`` is 1 and its
balancer's probe makes it unavailable under SP-P.  Un-saturating clears the
fault: the slow requests finish in a blink and the probe shows room again.

Redis is pointed at a closed port for every balancer: cross-region routing must
work from the HTTP-polled availability alone.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from django.conf import settings

from ops import http_probe
from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    metric_value,
    peer_forward_headers,
    replica_waiting,
    set_fault,
    start_balancer,
    start_replicas,
    state,
)
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MESSAGES = [{"role": "user", "content": "Which region answers?"}]
FORWARDED_OUT = 'meridian_requests_total{model="meridian-test",status="200",route="forwarded_out"}'
FORWARDED_IN = 'meridian_requests_total{model="meridian-test",status="200",route="forwarded_in"}'


@dataclass
class World:
    urls: dict[str, str]  # region → balancer URL
    replica_ports: dict[str, int]  # region → its replica's port
    key: str
    hogs: list[threading.Thread] = field(default_factory=list)

    def ask(self, region: str, **headers: str) -> httpx.Response:
        response = http_probe.post(
            f"{self.urls[region]}/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4},
            headers={"Authorization": f"Bearer {self.key}", **headers},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return response

    def saturate(self, region: str) -> None:
        port = self.replica_ports[region]
        set_fault(port, "slow", factor=200.0)
        for _ in range(3):
            thread = threading.Thread(target=_hog, args=(port,), daemon=True)
            thread.start()
            self.hogs.append(thread)
        eventually(
            lambda: replica_waiting(port) >= 1, what=f"{region} replica has a waiting request"
        )
        eventually(lambda: not _replica(self.urls[region])["available"], what=f"{region} full")

    def unsaturate(self, region: str) -> None:
        set_fault(self.replica_ports[region], "none")
        eventually(lambda: _replica(self.urls[region])["available"], what=f"{region} has room")


def _hog(port: int) -> None:
    """A long generation sent straight to a replica, past any balancer."""
    http_probe.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 600},
        timeout=120,
    )


def _replica(url: str) -> dict[str, Any]:
    replica: dict[str, Any] = state(url)["replicas"][0]
    return replica


def _idle(url: str) -> bool:
    return bool(state(url)["inflight"] == 0)


def _peer_has_room(url: str, peer: str) -> bool:
    row = next(p for p in state(url)["peers"] if p["name"] == peer)
    return bool(row["alive"] and row["models"].get(MODEL))


@pytest.fixture(scope="module")
def world(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[World]:
    regions = {name: topology.region(f"cr-{name}") for name in ("us", "eu", "ap")}
    topology.latency(regions["us"], regions["eu"], 80.0)
    topology.latency(regions["us"], regions["ap"], 180.0)
    topology.latency(regions["eu"], regions["ap"], 150.0)
    ports = {name: free_port() for name in regions}
    lb_ports = {name: free_port() for name in regions}
    for name, region in regions.items():
        topology.balancer(f"cr-{name}-lb", region, lb_ports[name])
        topology.replica(f"cr-{name}-a", region, ports[name])
    topology.service()
    key = topology.api_key()
    start_replicas(
        module_processes,
        "cr-replicas",
        {f"cr-{name}-a": port for name, port in ports.items()},
        "--max-num-seqs",
        "2",
    )
    env = {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    urls = {
        name: start_balancer(
            module_processes, env, f"cr-{name}-lb", lb_ports[name], MERIDIAN_DEMO="true"
        )
        for name in regions
    }
    world = World(urls, ports, key)
    for name in regions:
        for other in regions:
            if other != name:
                eventually(
                    functools.partial(_peer_has_room, urls[name], f"cr-{other}-lb"),
                    what=f"{name} sees {other} available",
                )
    yield world
    for port in ports.values():
        set_fault(port, "none")
    for thread in world.hogs:
        thread.join(timeout=30)


def test_saturated_region_forwards_to_the_nearest_available_one_and_comes_home(
    world: World,
) -> None:
    assert world.ask("us").headers["x-meridian-balancer"] == "cr-us-lb"
    eu_out_before = metric_value(world.urls["eu"], FORWARDED_OUT)
    eu_in_before = metric_value(world.urls["eu"], FORWARDED_IN)

    world.saturate("us")
    away = world.ask("us")
    assert away.headers["x-meridian-entry"] == "cr-us-lb"
    assert away.headers["x-meridian-balancer"] == "cr-eu-lb"  # 80 ms beats 180 ms
    assert away.headers["x-meridian-replica"] == "cr-eu-a"
    assert metric_value(world.urls["eu"], FORWARDED_IN) == eu_in_before + 1
    assert metric_value(world.urls["us"], FORWARDED_OUT) >= 1

    world.saturate("eu")
    eventually(lambda: not _peer_has_room(world.urls["us"], "cr-eu-lb"), what="us sees eu full")
    farther = world.ask("us")
    assert farther.headers["x-meridian-balancer"] == "cr-ap-lb"
    assert farther.headers["x-meridian-entry"] == "cr-us-lb"

    world.unsaturate("eu")
    world.unsaturate("us")
    home = world.ask("us")
    assert "x-meridian-entry" not in home.headers
    assert home.headers["x-meridian-balancer"] == "cr-us-lb"
    # eu served what us sent it and never passed anything on.
    assert metric_value(world.urls["eu"], FORWARDED_OUT) == eu_out_before == 0
    for url in world.urls.values():
        eventually(functools.partial(_idle, url), what="nothing left in flight")


def test_a_forwarded_request_queues_at_the_full_peer_instead_of_hopping_again(
    world: World,
) -> None:
    world.saturate("eu")
    ap_in_before = metric_value(world.urls["ap"], FORWARDED_IN)
    answers: list[httpx.Response] = []
    hop = threading.Thread(
        target=lambda: answers.append(world.ask("eu", **peer_forward_headers("cr-us-lb")))
    )
    hop.start()
    eventually(
        lambda: state(world.urls["eu"])["queue"] == 1, what="eu queues the forwarded request"
    )
    world.unsaturate("eu")
    hop.join(timeout=30)
    assert answers and answers[0].headers["x-meridian-balancer"] == "cr-eu-lb"
    assert metric_value(world.urls["ap"], FORWARDED_IN) == ap_in_before
    assert metric_value(world.urls["eu"], FORWARDED_OUT) == 0
    assert (
        metric_value(
            world.urls["eu"],
            'meridian_queue_wait_seconds_count{model="meridian-test",outcome="placed"}',
        )
        >= 1
    )


def test_availability_needs_the_internal_token(world: World) -> None:
    url = f"{world.urls['us']}/internal/availability"
    assert http_probe.get(url).status_code == 401
    assert http_probe.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    report = http_probe.get(
        url, headers={"Authorization": f"Bearer {settings.MERIDIAN_INTERNAL_TOKEN}"}
    )
    assert report.status_code == 200
    body = report.json()
    assert body["balancer"] == "cr-us-lb" and body["region"] == "cr-us"
    assert body["models"] == {MODEL: 1} and body["queues"] == {MODEL: 0}
    # Routing ran on these polls: Redis was unreachable the whole time.
    assert state(world.urls["us"])["redis"]["connected"] is False
