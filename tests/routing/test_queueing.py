"""Selective pushing through the regional queue, in process (SkyLB §3.3).

A request that finds no available target waits FCFS in the balancer and leaves
when a completion, a probe or a peer report makes one available, when its
deadline passes (503), or when its client goes away, leaving nothing behind.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.availability import PushingConfig, PushingMode
from core.errors import ApiError
from core.leases import Lease
from core.topology import ModelSpec, PeerSpec
from routing.runtime import BalancerRuntime
from routing.telemetry import QUEUE_CANCELLED, QUEUE_PLACED, QUEUE_TIMEOUT
from tests.support.inprocess import peer_report, proxy_call
from tests.support.upstreams import MODEL, Upstreams

pytestmark = pytest.mark.anyio

SP_O = ModelSpec(MODEL, pushing=PushingConfig(PushingMode.SP_O))
NEAR = PeerSpec("near", "http://near", "eu", 80.0)


def _hold(rt: BalancerRuntime, name: str = "a") -> Lease:
    """Fill replica ``name`` (cap 1) as a running request would."""
    target = rt.router.target(name)
    assert target is not None
    return rt.router.lease(proxy_call(rid="held").descriptor, target)


async def _queued(rt: BalancerRuntime, length: int) -> None:
    for _ in range(100):
        if rt.queues.total() == length:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"queue length {rt.queues.total()}, expected {length}")


def _waits(rt: BalancerRuntime, outcome: str) -> int:
    return rt.metrics.queue_wait.count(MODEL, outcome)


async def test_queued_requests_leave_in_order_as_completions_free_the_replica(
    build_runtime: Any,
) -> None:
    upstreams = Upstreams()
    rt = await build_runtime(upstreams, replicas=("a",), max_outstanding=1, model=SP_O)
    held = _hold(rt)
    first = asyncio.create_task(rt.dispatcher.dispatch(proxy_call(rid="first")))
    await _queued(rt, 1)
    second = asyncio.create_task(rt.dispatcher.dispatch(proxy_call(rid="second")))
    await _queued(rt, 2)
    assert upstreams.calls == []
    held.release(ok=True)  # the completion wakes the queue: no polling
    responses = await asyncio.gather(first, second)
    assert [r.status_code for r in responses] == [200, 200]
    assert [c.headers["X-Request-ID"] for c in upstreams.calls] == ["first", "second"]
    assert _waits(rt, QUEUE_PLACED) == 2
    assert rt.queues.total() == 0 and rt.inflight() == 0


async def test_sp_p_holds_requests_until_a_probe_shows_no_waiting(build_runtime: Any) -> None:
    upstreams = Upstreams()
    upstreams.waiting["a"] = 3
    rt = await build_runtime(upstreams, replicas=("a",))
    target = rt.router.target("a")
    assert target is not None
    await rt.prober.probe(target)
    assert not rt.router.is_available(target)
    task = asyncio.create_task(rt.dispatcher.dispatch(proxy_call()))
    await _queued(rt, 1)
    await rt.prober.probe(target)  # still three waiting: stays queued
    await _queued(rt, 1)
    upstreams.waiting["a"] = 0
    await rt.prober.probe(target)
    response = await task
    assert response["X-Meridian-Replica"] == "a"
    assert _waits(rt, QUEUE_PLACED) == 1 and rt.inflight() == 0


async def test_client_leaving_while_queued_leaves_nothing_behind(build_runtime: Any) -> None:
    upstreams = Upstreams()
    rt = await build_runtime(upstreams, replicas=("a",), max_outstanding=1, model=SP_O)
    held = _hold(rt)
    task = asyncio.create_task(rt.dispatcher.dispatch(proxy_call()))
    await _queued(rt, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rt.queues.total() == 0 and _waits(rt, QUEUE_CANCELLED) == 1
    held.release(ok=True)
    await asyncio.sleep(0.01)
    assert upstreams.calls == [] and rt.inflight() == 0


async def test_client_leaving_just_after_being_placed_gives_the_slot_back(
    build_runtime: Any,
) -> None:
    upstreams = Upstreams()
    rt = await build_runtime(upstreams, replicas=("a",), max_outstanding=1, model=SP_O)
    held = _hold(rt)
    task = asyncio.create_task(rt.dispatcher.dispatch(proxy_call()))
    await _queued(rt, 1)
    held.release(ok=True)
    await asyncio.sleep(0)  # the pump places the request and takes the lease...
    assert rt.queues.total() == 0 and rt.router.ledger.total == 1
    task.cancel()  # ...and the client goes before its task resumes
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rt.router.ledger.total == 0 and upstreams.calls == []


async def test_a_request_waiting_past_its_deadline_gets_503_with_retry_after(
    build_runtime: Any,
) -> None:
    short = ModelSpec(MODEL, pushing=PushingConfig(PushingMode.SP_O), queue_max_wait_s=0.05)
    rt = await build_runtime(Upstreams(), replicas=("a",), max_outstanding=1, model=short)
    held = _hold(rt)
    with pytest.raises(ApiError) as info:
        await rt.dispatcher.dispatch(proxy_call())
    assert (info.value.status, info.value.code) == (503, "queue_timeout")
    assert info.value.headers == {"Retry-After": "2"}
    assert rt.queues.total() == 0 and _waits(rt, QUEUE_TIMEOUT) == 1
    held.release(ok=True)
    assert rt.inflight() == 0


async def test_a_forwarded_request_waits_for_a_local_replica_not_a_peer(
    build_runtime: Any,
) -> None:
    upstreams = Upstreams()
    rt = await build_runtime(
        upstreams, replicas=("a",), peers=(NEAR,), max_outstanding=1, model=SP_O
    )
    held = _hold(rt)
    task = asyncio.create_task(rt.dispatcher.dispatch(proxy_call(forwarded=True)))
    await _queued(rt, 1)
    held.release(ok=True)
    response = await task
    assert response["X-Meridian-Replica"] == "a" and upstreams.hosts() == ["a"]
    assert rt.remote.ledger.total == 0


async def test_a_peer_report_with_room_takes_the_queued_request(build_runtime: Any) -> None:
    upstreams = Upstreams()
    rt = await build_runtime(
        upstreams, replicas=("a",), peers=(NEAR,), max_outstanding=1, model=SP_O
    )
    held = _hold(rt)
    rt.remote.record_report("near", peer_report("near", available=0))  # alive, but full
    task = asyncio.create_task(rt.dispatcher.dispatch(proxy_call()))
    await _queued(rt, 1)
    rt.remote.record_report("near", peer_report("near", available=1))
    response = await task
    assert response["X-Meridian-Entry"] == "lb-us" and upstreams.hosts() == ["near"]
    assert rt.metrics.requests.value(MODEL, "200", "forwarded_out") == 1
    held.release(ok=True)
    assert rt.inflight() == 0
