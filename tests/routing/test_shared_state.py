"""The shared-state exchange against a real Redis: two processes' views of one
balancer (each a ``LocalRouter`` with its own ``SharedStateSync``), a process that
dies, a Redis that goes away and comes back, and a warm start from the route log."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import redis
from django.conf import settings

from core.metrics import MetricsRegistry
from core.registry import build_policy
from core.router import LocalRouter
from core.shared_state import SharedConfig
from core.topology import ModelSpec, ReplicaSpec
from core.types import RequestDescriptor
from ops.embedded_redis import EmbeddedRedis
from routing.shared_state import SharedStateSync, shared_keys

pytestmark = pytest.mark.anyio

MODEL = "m"
DOWN_URL = "redis://127.0.0.1:1/0"  # nothing listens there


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _router() -> LocalRouter:
    router = LocalRouter(build_policy, max_outstanding=8)
    specs = [ReplicaSpec(n, f"http://{n}", MODEL, "us", "us-1", "reserved") for n in "abc"]
    router.apply(specs, {MODEL: ModelSpec(MODEL, "skylb")})
    return router


def _request(rid: str, blocks: tuple[int, ...] = ()) -> RequestDescriptor:
    return RequestDescriptor(rid, MODEL, 16 * max(1, len(blocks)), block_hashes=blocks)


Make = Callable[..., SharedStateSync]


@pytest.fixture
async def make_sync(redis_server: EmbeddedRedis) -> AsyncIterator[Make]:
    """``make_sync(process, url=..., **config)``: a process of one fresh balancer."""
    balancer = f"lb-so-{uuid.uuid4().hex[:8]}"
    made: list[SharedStateSync] = []

    def make(process: str, url: str = settings.REDIS_URL, **config: float) -> SharedStateSync:
        sync = SharedStateSync(
            url,
            balancer=balancer,
            router=_router(),
            config=SharedConfig(**config),  # type: ignore[arg-type]
            registry=MetricsRegistry(),
            process=process,
        )
        made.append(sync)
        return sync

    yield make
    for sync in made:
        await sync.close()
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*shared_keys(balancer))
    client.close()


async def test_each_process_sees_the_others_in_flight_requests(make_sync: Make) -> None:
    one, two = make_sync("p1"), make_sync("p2")
    a = one.router.target("a")
    assert a is not None
    leases = [one.router.lease(_request(f"r{i}"), a) for i in range(3)]
    assert await one.sync() and await two.sync()
    seen = two.router.target("a")
    assert seen is not None and (seen.peer_outstanding, seen.outstanding) == (3, 0)
    # Global least-request: the sibling's three requests steer this process away from a.
    chosen = two.router.select(_request("x")).target
    assert chosen is not None and chosen.target_id == "b"
    for lease in leases:
        lease.release(ok=True)
    assert await one.sync() and await two.sync()
    assert seen.peer_outstanding == 0 and two.view.peers == 1


async def test_a_prefix_routed_by_one_process_steers_the_other(make_sync: Make) -> None:
    one, two = make_sync("p1"), make_sync("p2")
    blocks = tuple(range(1000, 1032))
    c = one.router.target("c")
    assert c is not None
    one.router.lease(_request("r", blocks), c)  # p1 decided: this prefix lives on c
    assert await one.sync() and await two.sync()
    chosen = two.router.select(_request("x", blocks)).target
    assert chosen is not None and chosen.target_id == "c"
    assert two.view.applied == 1 and one.view.published == 1


async def test_a_process_that_stops_publishing_leaves_no_count_behind(make_sync: Make) -> None:
    one, two = make_sync("p1", peer_ttl_s=0.3), make_sync("p2", peer_ttl_s=0.3)
    a = one.router.target("a")
    assert a is not None
    one.router.lease(_request("r"), a)  # never released: p1 "dies" holding it
    assert await one.sync() and await two.sync()
    assert two.router.target("a").peer_outstanding == 1  # type: ignore[union-attr]
    await asyncio.sleep(0.4)  # past the TTL with no exchange from p1
    assert await two.sync()
    assert two.router.target("a").peer_outstanding == 0  # type: ignore[union-attr]
    assert two.view.peers == 0


async def test_redis_down_degrades_at_once_then_converges(make_sync: Make) -> None:
    one, two = make_sync("p1"), make_sync("p2")
    a = one.router.target("a")
    assert a is not None
    one.router.lease(_request("r"), a)
    assert await one.sync() and await two.sync()
    assert two.router.target("a").peer_outstanding == 1  # type: ignore[union-attr]
    healthy = (two._redis, two._script)
    down = redis.asyncio.Redis.from_url(DOWN_URL)
    two._redis, two._script = down, down.register_script("return 1")
    blocks = tuple(range(50, 70))
    b = two.router.target("b")
    assert b is not None
    two.router.lease(_request("d", blocks), b)  # decided while Redis is away
    assert not await two.sync()
    # Within one exchange: the local view only, said in /metrics and kept routing.
    assert two.view.degraded and two.router.target("a").peer_outstanding == 0  # type: ignore[union-attr]
    assert two.metrics.degraded.value() == 1 and two.metrics.errors.total() == 1
    assert two.router.select(_request("x")).target is not None
    assert two.status()["degraded"] is True and two.view.pending == 1
    await down.aclose()
    two._redis, two._script = healthy
    assert await two.sync() and await one.sync()
    assert not two.view.degraded and two.metrics.degraded.value() == 0
    assert two.router.target("a").peer_outstanding == 1  # type: ignore[union-attr]
    chosen = one.router.select(_request("y", blocks)).target  # the outage's route arrived
    assert chosen is not None and chosen.target_id == "b"


async def test_a_redis_that_never_answers_counts_as_down_after_one_timeout(
    make_sync: Make,
) -> None:
    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)  # accept and read, never answer: a hung Redis
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sync = make_sync("p1", url=f"redis://127.0.0.1:{port}/0", timeout_s=0.1)
    assert not await sync.sync()
    assert sync.view.degraded and sync.metrics.errors.total() == 1
    server.close()


async def test_a_new_process_replays_the_log_before_traffic(make_sync: Make) -> None:
    one = make_sync("p1")
    for i, name in enumerate("abc"):
        target = one.router.target(name)
        assert target is not None
        one.router.lease(_request(f"r{i}", tuple(range(i * 100, i * 100 + 8))), target)
    assert await one.sync()
    late = make_sync("p3", read_batch=2)  # several reads to catch up
    assert await late.warm_start(budget_s=5.0)
    assert late.view.caught_up and late.view.applied == 3
    for i, name in enumerate("abc"):
        chosen = late.router.select(_request(f"x{i}", tuple(range(i * 100, i * 100 + 8)))).target
        assert chosen is not None and chosen.target_id == name


async def test_warm_start_gives_up_cold_when_redis_is_down(make_sync: Make) -> None:
    cold = make_sync("p9", url=DOWN_URL)
    assert not await cold.warm_start(budget_s=1.0)
    assert cold.view.degraded and not cold.view.caught_up


async def test_an_unreadable_log_entry_is_skipped_and_counted(make_sync: Make) -> None:
    one, two = make_sync("p1"), make_sync("p2")
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.xadd(one.keys[1], {"p": "px", "r": "not packed"})
    client.hset(one.keys[0], "px", "bad-stamp")
    client.close()
    c = one.router.target("c")
    assert c is not None
    one.router.lease(_request("r", (5, 6, 7)), c)
    assert await one.sync() and await two.sync()
    assert two.view.applied == 1 and two.view.skipped_records == 1
    assert two.view.peers == 1  # the field with a bad stamp was dropped by the script


async def _tick_for(seconds: float, *syncs: SharedStateSync) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        for sync in syncs:
            assert await sync.tick()
        await asyncio.sleep(0.01)


async def test_an_idle_process_stops_exchanging_and_resumes_on_a_change(make_sync: Make) -> None:
    paced = {"sync_s": 0.01, "idle_check_s": 0.08, "peer_ttl_s": 6.0}  # heartbeat 2 s
    one, two = make_sync("p1", **paced), make_sync("p2", **paced)
    await _tick_for(0.3, one, two)  # both joined, each saw the other's arrival
    assert one.view.peers == two.view.peers == 1
    full = (one.pacer.full_runs, two.pacer.full_runs)
    checks = one.pacer.checks
    await _tick_for(0.6, one, two)  # ~60 ticks each with nothing to tell
    assert (one.pacer.full_runs, two.pacer.full_runs) == full  # no script ran
    assert one.pacer.idle and one.status()["idle"] is True
    assert 1 <= one.pacer.checks - checks <= 0.6 / 0.08 + 1  # a GET per idle period at most
    assert one.metrics.exchanges.value("full") == full[0]
    # A decision on p1: its next tick publishes at once, and p2's next check sees it.
    a = one.router.target("a")
    assert a is not None
    one.router.lease(_request("r", (11, 12, 13)), a)
    assert await one.tick() and one.pacer.full_runs == full[0] + 1 and not one.pacer.idle
    seen = two.router.target("a")
    assert seen is not None
    deadline = asyncio.get_running_loop().time() + 1.0
    while seen.peer_outstanding == 0 and asyncio.get_running_loop().time() < deadline:
        assert await two.tick()
        await asyncio.sleep(0.01)
    assert seen.peer_outstanding == 1 and two.pacer.full_runs == full[1] + 1
    assert two.view.applied == 1  # and the route with it


async def test_an_idle_loop_sleeps_until_due_and_a_decision_wakes_it(make_sync: Make) -> None:
    one = make_sync("p1", sync_s=0.01, idle_check_s=5.0, peer_ttl_s=60.0)
    await _tick_for(0.5, one)  # checks backed off to ~0.3 s apart, heartbeat at 20 s
    assert one.pacer.interval > 0.01  # quiet: the loop waits on its wake-up, not a tick
    waiter = asyncio.create_task(one.wait_next())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()
    a = one.router.target("a")
    assert a is not None
    one.router.lease(_request("r", (1, 2)), a)  # a decision wakes the loop, no timer
    for _ in range(10):
        await asyncio.sleep(0)
    assert waiter.done()
    assert await one.tick() and one.view.published == 1 and not one.pacer.idle
