"""A cold connection pool under a burst: 128 simultaneous non-streaming requests on a
balancer that has not yet opened a connection to its replicas all succeed.

Real processes: a daphne balancer and two emulated replicas on 127.0.0.1, and the
burst from one ``httpx.AsyncClient`` with room for every request at once, so all
128 reach the balancer together and each needs an upstream connection the pool
does not have yet.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    start_balancer,
    start_replicas,
)
from tests.support.load import cpu_hog
from tests.support.processes import ProcessGroup, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

BURST = 128
# Busy-loop processes that compete with the balancer for the CPU during the burst,
# as on the busy machine where a cold pool's connects once timed out.
HOGS = 4


@dataclass(frozen=True)
class Region:
    url: str
    key: str


@pytest.fixture(scope="module")
def region(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Region]:
    ports = {"cb-a": free_port(), "cb-b": free_port()}
    balancer_port = free_port()
    home = topology.region("cb-us")
    topology.balancer("cb-us-lb", home, balancer_port)
    for name, port in ports.items():
        topology.replica(name, home, port)
    topology.service()
    key = topology.api_key()
    start_replicas(module_processes, "cb-replicas", ports)
    url = start_balancer(
        module_processes,
        {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
        "cb-us-lb",
        balancer_port,
    )
    yield Region(url, key)


async def _burst(region: Region) -> Counter[str]:
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
    headers = {"Authorization": f"Bearer {region.key}"}
    async with httpx.AsyncClient(
        base_url=region.url, headers=headers, limits=limits, timeout=120.0
    ) as client:

        async def one(i: int) -> str:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"burst request {i}"}],
                "max_tokens": 4,
            }
            response = await client.post("/v1/chat/completions", json=body)
            if response.status_code == 200:
                return "ok"
            return f"{response.status_code} {response.text[:200]}"

        outcomes = await asyncio.gather(*(one(i) for i in range(BURST)))
    return Counter(outcomes)


def test_a_burst_on_a_cold_pool_gets_no_errors(region: Region) -> None:
    with cpu_hog(HOGS):
        outcomes = asyncio.run(_burst(region))
    assert outcomes == Counter({"ok": BURST}), outcomes
