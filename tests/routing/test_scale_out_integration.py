"""Two balancer processes of one region, sharing state through the real Redis.

One region, one balancer ``so-lb``, three emulated replicas, SkyLB's prefix policy
with SP-O pushing (so a prefix match is not held back by SP-P's one-push budget).
Processes A and B both play ``so-lb`` with shared state on, each on its own port,
as two hosts behind one load balancer would, so the test can pick which process a
request lands on.  A third pair shares one port with ``SO_REUSEPORT``
(``ops.stack.serve``), as ``make run`` starts them.

The claims, as a client and an operator see them:

* a request in flight through A counts on B's view of that replica (global
  least-request, ``meridian_replica_sibling_outstanding``);
* prefixes A routed (spread over the replicas by a concurrent burst) land on the
  same replicas when they arrive at B: B would otherwise send each to the least
  loaded replica, the same one for all;
* a restarted B replays the route log before serving: its first requests go where
  A sent their prefixes while B was down.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
import redis
from django.conf import settings

from ops import http_probe
from ops.stack.plan import shared_port_argv
from routing.shared_state import shared_keys
from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    metric_value,
    set_fault,
    start_balancer,
    start_replicas,
)
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port, wait_http

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

REPLICAS = ("so-a", "so-b", "so-c")
SHARED = {
    "MERIDIAN_SHARED_STATE": "1",
    "MERIDIAN_SHARED_SYNC_S": "0.05",
    "MERIDIAN_SHARED_PEER_TTL_S": "1",
}


@dataclass(frozen=True)
class Region:
    key: str
    ports: dict[str, int]  # replica → port
    env: dict[str, str]
    port: int  # the balancer's registered address

    def chat(self, url: str, content: str, *, max_tokens: int = 4) -> httpx.Response:
        reply = http_probe.post(
            f"{url}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
            },
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        return reply


def _prompt(topic: int, turn: str = "") -> str:
    # Long enough for several 16-token blocks shared by every turn of one topic.
    return f"conversation {topic}: " + " ".join(f"w{topic}x{i}" for i in range(120)) + turn


@pytest.fixture(scope="module")
def region(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Region]:
    ports = {name: free_port() for name in REPLICAS}
    start_replicas(module_processes, "so-replicas", ports)
    topology.service(policy="skylb", policy_params={"pushing": "sp-o"})
    place = topology.region("so-region")
    port = free_port()
    topology.balancer("so-lb", place, port)
    for name, replica_port in ports.items():
        topology.replica(name, place, replica_port)
    env = {**child_env, **SHARED}
    _forget_shared_state()  # a route log left by an earlier run would steer this one
    yield Region(topology.api_key("scale-out"), ports, env, port)
    _forget_shared_state()


def _forget_shared_state() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*shared_keys("so-lb"))
    client.close()


def _slow(region: Region, factor: float) -> None:
    """Every replica's steps ``factor`` times longer (1: back to normal)."""
    for port in region.ports.values():
        if factor > 1:
            set_fault(port, "slow", factor=factor)
        else:
            set_fault(port, "none")


def _peers(url: str) -> int:
    return int(http_probe.get(f"{url}/health").json()["shared_state"]["peers"])


def test_two_processes_share_load_and_prefixes_and_a_restart_starts_warm(
    region: Region, processes: ProcessGroup
) -> None:
    a = start_balancer(processes, region.env, "so-lb", free_port())
    b_port = free_port()
    b = start_balancer(processes, region.env, "so-lb", b_port)
    eventually(lambda: _peers(b) == 1, what="B sees A")

    # Global least-request: a slow request through A counts in B's view of its replica.
    _slow(region, 2000)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(region.chat, a, _prompt(99))
        sibling = "meridian_replica_sibling_outstanding{"
        eventually(lambda: metric_value(b, sibling) == 1, what="B sees A's request")
        _slow(region, 1)
        assert pending.result().headers["X-Meridian-Replica"] in REPLICAS
    eventually(lambda: metric_value(b, sibling) == 0, what="B sees it finish")

    # Shared index: a concurrent burst through A spreads six topics over the replicas.
    _slow(region, 300)
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda t: region.chat(a, _prompt(t)), range(6)))
    _slow(region, 1)
    placed = {t: r.headers["X-Meridian-Replica"] for t, r in enumerate(replies)}
    assert len(set(placed.values())) >= 2, placed  # the burst did spread
    learned = 'meridian_shared_state_routes_total{outcome="learned"}'
    eventually(lambda: metric_value(b, learned) >= 7, what="B learns A's routes")
    for topic, replica in placed.items():
        reply = region.chat(b, _prompt(topic, " and a follow-up"))
        assert reply.headers["X-Meridian-Replica"] == replica, (topic, placed)

    # Warm restart: B goes down, A routes new topics, B comes back and routes them warm.
    b_process = next(p for p in processes.processes if p.args and str(b_port) in p.args)
    b_process.send_signal(signal.SIGTERM)
    b_process.wait(timeout=20)
    _slow(region, 300)
    with ThreadPoolExecutor(6) as pool:
        later = list(pool.map(lambda t: region.chat(a, _prompt(t)), range(10, 16)))
    _slow(region, 1)
    placed_later = {t + 10: r.headers["X-Meridian-Replica"] for t, r in enumerate(later)}
    assert len(set(placed_later.values())) >= 2, placed_later
    b2 = start_balancer(processes, region.env, "so-lb", free_port())
    assert http_probe.get(f"{b2}/health").json()["shared_state"]["warm"] is True
    for topic, replica in {**placed_later, **placed}.items():
        reply = region.chat(b2, _prompt(topic, " after the restart"))
        assert reply.headers["X-Meridian-Replica"] == replica, (topic, placed_later)


def test_processes_sharing_one_port_both_serve_and_see_each_other(
    region: Region, processes: ProcessGroup
) -> None:
    env = {**region.env, "MERIDIAN_BALANCER": "so-lb"}
    port = free_port()
    for label in ("so-shared-1", "so-shared-2"):
        processes.start(label, shared_port_argv("127.0.0.1", port), env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", timeout=30)

    def both_answering() -> bool:
        seen = set()
        for _ in range(24):  # a fresh connection each: the kernel spreads them by hash
            body = http_probe.get(f"{url}/health").json()
            if body.get("shared_state") and body["shared_state"]["peers"] >= 1:
                seen.add(body["shared_state"]["process"])
        return len(seen) == 2

    eventually(both_answering, what="two processes answering on one port, each seeing the other")
    reply = region.chat(url, _prompt(42))
    assert reply.headers["X-Meridian-Replica"] in REPLICAS
