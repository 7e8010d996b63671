"""The wrappers around the production transport: the demo's RTT and the partition fault.

Each wraps ``PoolTransport`` talking to a loopback upstream, so what passes
through is a real request on the relay's pool.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator

import pytest

from core.topology import PeerSpec
from routing.transport import (
    DemoLatency,
    PartitionFault,
    PeerPartition,
    PoolTransport,
    UpstreamRequest,
)
from routing.upstream import UpstreamFailure
from routing.upstream_pool import UpstreamPool
from tests.support.loopback import LoopbackServer, Reply, serving

pytestmark = pytest.mark.anyio

CHUNK = b"data: one\n\n"
NEAR = PeerSpec("near", "http://near", "eu", 80.0)


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[LoopbackServer, str, PoolTransport]]:
    pool = UpstreamPool(connect_timeout_s=2.0, read_timeout_s=5.0)
    async with serving("up", lambda request: Reply(chunks=[CHUNK], stall=True)) as (server, url):
        yield server, f"{url}/v1/chat/completions", PoolTransport(pool)
    await pool.aclose()


def _request(url: str, peer: PeerSpec | None = None) -> UpstreamRequest:
    return UpstreamRequest(url, b"{}", {"Content-Type": "application/json"}, peer=peer)


async def test_the_demo_charges_half_a_forwards_rtt_each_way_and_nothing_else(
    upstream: tuple[LoopbackServer, str, PoolTransport],
) -> None:
    _, url, pool = upstream
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    demo = DemoLatency(pool, sleep=record)
    opened = await demo.open(_request(url))  # to a replica: the network's own latency
    await opened.response.aclose()
    assert slept == []
    unknown = PeerSpec("far", "http://far", "ap", math.nan)
    opened = await demo.open(_request(url, unknown))  # no RTT configured: nothing to charge
    await opened.response.aclose()
    assert slept == []
    opened = await demo.open(_request(url, NEAR))
    assert opened.first_chunk == CHUNK and slept == [0.04, 0.04]
    await opened.response.aclose()


async def test_a_client_leaving_on_the_first_bytes_way_back_disconnects_the_peer(
    upstream: tuple[LoopbackServer, str, PoolTransport],
) -> None:
    server, url, pool = upstream
    calls = 0

    async def sleep(seconds: float) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            await asyncio.Event().wait()  # the way back: the client leaves meanwhile

    task = asyncio.create_task(DemoLatency(pool, sleep=sleep).open(_request(url, NEAR)))
    for _ in range(500):  # until the first byte is on its way back (a readiness wait)
        if calls == 2:
            break
        await asyncio.sleep(0.01)
    assert calls == 2 and len(server.requests) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(server.client_left.wait(), 5)


async def test_a_partition_cuts_forwards_to_its_peers_only_until_it_expires(
    upstream: tuple[LoopbackServer, str, PoolTransport],
) -> None:
    server, url, pool = upstream
    partition = PeerPartition()
    transport = PartitionFault(pool, partition)
    partition.set(["near"], time.time() + 60)
    with pytest.raises(UpstreamFailure, match="partitioned"):
        await transport.open(_request(url, NEAR))
    assert server.requests == []  # not a byte was sent
    opened = await transport.open(_request(url))  # replicas are not behind the cut
    await opened.response.aclose()
    partition.set(["near"], time.time() - 1)  # expired: healed on its own
    opened = await transport.open(_request(url, NEAR))
    await opened.response.aclose()
    assert len(server.requests) == 2
