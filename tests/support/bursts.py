"""A burst of simultaneous chat requests against a balancer process, for the cold-pool tests.

``burst_region`` starts two emulated replicas and a daphne balancer in front of
them (rows from the module's ``TopologyFactory``); ``burst`` sends ``count``
non-streaming requests at once from one ``httpx.AsyncClient`` with room for all
of them, so they reach the balancer together, and counts the outcomes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

import httpx

from tests.support.balancers import MODEL, TopologyFactory, start_balancer, start_replicas
from tests.support.processes import ProcessGroup, free_port


@dataclass(frozen=True)
class Region:
    url: str
    key: str


def burst_region(
    topology: TopologyFactory,
    child_env: dict[str, str],
    group: ProcessGroup,
    prefix: str,
    **overrides: str,
) -> Region:
    """One region: a balancer (``overrides`` for its environment) and two replicas."""
    ports = {f"{prefix}-a": free_port(), f"{prefix}-b": free_port()}
    balancer_port = free_port()
    home = topology.region(f"{prefix}-us")
    topology.balancer(f"{prefix}-us-lb", home, balancer_port)
    for name, port in ports.items():
        topology.replica(name, home, port)
    topology.service()
    key = topology.api_key()
    start_replicas(group, f"{prefix}-replicas", ports)
    url = start_balancer(
        group,
        {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
        f"{prefix}-us-lb",
        balancer_port,
        **overrides,
    )
    return Region(url, key)


async def burst(region: Region, count: int) -> Counter[str]:
    """``count`` simultaneous requests; "ok" or "<status> <body start>" for each."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
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

        outcomes = await asyncio.gather(*(one(i) for i in range(count)))
    return Counter(outcomes)
