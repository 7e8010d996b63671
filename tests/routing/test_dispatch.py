"""The dispatcher's decisions, in process: retries, forwarding, and refusals.

A real ``BalancerRuntime`` with its topology set by hand, its production clients
talking to loopback servers that play replicas and peer balancers, so each
failure can be placed exactly (a 500 here, a reset there).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.availability import PushingConfig, PushingMode
from core.errors import ApiError
from core.topology import ModelSpec, PeerSpec
from routing.calls import HOP_HEADER, ProxyResponse
from routing.internal_auth import PEER_TOKEN_HEADER
from routing.transport import DemoLatency
from tests.support.inprocess import proxy_call
from tests.support.upstreams import MODEL, Upstreams

pytestmark = pytest.mark.anyio


async def _drain(response: ProxyResponse) -> bytes:
    assert response.stream is not None
    return b"".join([chunk async for chunk in response.stream])


async def test_failure_before_the_first_byte_retries_on_a_different_replica(
    build_runtime: Any,
) -> None:
    upstreams = Upstreams(a="500")
    rt = await build_runtime(upstreams)
    response = await rt.dispatcher.dispatch(proxy_call())
    assert response.status_code == 200 and response["X-Meridian-Replica"] == "b"
    assert upstreams.hosts() == ["a", "b"]
    assert rt.router.target("a").healthy is False  # marked at once, not at the next probe
    assert rt.router.ledger.total == 0
    assert rt.metrics.retries.value(MODEL) == 1
    assert rt.router.usage("b").cached_tokens == 16


async def test_streaming_reset_before_the_first_byte_is_retried(build_runtime: Any) -> None:
    upstreams = Upstreams(a="reset")
    rt = await build_runtime(upstreams)
    response = await rt.dispatcher.dispatch(proxy_call(stream=True))
    assert response["X-Meridian-Replica"] == "b"
    assert rt.router.ledger.total == 1  # held by the stream until it ends
    body = await _drain(response)
    assert b'"usage"' not in body and body.endswith(b"data: [DONE]\n\n")
    assert rt.router.ledger.total == 0
    assert rt.metrics.requests.value(MODEL, "200", "local") == 1


async def test_every_replica_failing_is_a_502_with_nothing_left_in_flight(
    build_runtime: Any,
) -> None:
    rt = await build_runtime(Upstreams(a="refuse", b="503"))
    with pytest.raises(ApiError) as info:
        await rt.dispatcher.dispatch(proxy_call())
    assert (info.value.status, info.value.code) == (502, "upstream_error")
    assert rt.router.ledger.total == 0


async def test_a_busy_replica_is_skipped_but_not_marked_unhealthy(build_runtime: Any) -> None:
    upstreams = Upstreams(a="429")
    rt = await build_runtime(upstreams)
    response = await rt.dispatcher.dispatch(proxy_call())
    assert response["X-Meridian-Replica"] == "b"
    assert rt.router.target("a").healthy is True


async def test_no_local_replica_forwards_to_the_nearest_peer_paying_the_demo_rtt(
    build_runtime: Any,
) -> None:
    upstreams = Upstreams()
    peers = (
        PeerSpec("far", "http://far", "ap", 150.0),
        PeerSpec("near", "http://near", "eu", 80.0),
    )
    rt = await build_runtime(
        upstreams, replicas=(), peers=peers, demo=True, internal_token="install-secret"
    )
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    demo = rt.dispatcher.transport
    assert isinstance(demo, DemoLatency)  # demo mode wraps the production transport
    demo.sleep = record
    call = proxy_call()
    response = await rt.dispatcher.dispatch(call)
    assert response.status_code == 200
    # Half the RTT on the way out, half before the first byte is relayed back.
    assert upstreams.hosts() == ["near"] and slept == [0.04, 0.04]
    sent = upstreams.calls[0]
    assert sent.headers[HOP_HEADER] == "lb-us"
    assert sent.headers[PEER_TOKEN_HEADER] == "install-secret"  # proves the hop header
    assert sent.headers["Authorization"] == "Bearer mk-test"
    assert sent.headers["X-Session-ID"] == "10.0.0.9"
    assert sent.content == call.raw_body  # the client's own body, not the replica's
    assert response["X-Meridian-Entry"] == "lb-us"
    assert response["X-Meridian-Replica"] == "near-r"
    assert rt.metrics.requests.value(MODEL, "200", "forwarded_out") == 1
    assert rt.inflight() == 0


async def test_engines_that_schedule_by_priority_get_the_cost_models_priority(
    build_runtime: Any,
) -> None:
    """``engine_queue: priority`` (vLLM started with ``--scheduling-policy priority``):
    each request reaches its replica with the priority the cost model gave it, 1 for
    a cold copy into a cache with no room for it and 0 once the replica holds the
    prompt; the client's own fields are kept."""
    upstreams = Upstreams()
    spec = ModelSpec(
        MODEL,
        policy="meridian",
        policy_params={"engine_queue": "priority", "kv_capacity_tokens": 256},
        pushing=PushingConfig(PushingMode.TOKENS),
    )
    rt = await build_runtime(upstreams, replicas=("a",), model=spec)
    long = " ".join(f"word{i}" for i in range(600))
    for _ in range(2):
        response = await rt.dispatcher.dispatch(proxy_call(content=long))
        assert response.status_code == 200
    sent = [json.loads(call.content) for call in upstreams.calls]
    assert [body["priority"] for body in sent] == [1, 0]
    assert all(body["messages"][0]["content"] == long for body in sent)
    assert rt.inflight() == 0


async def test_a_refusing_peer_falls_through_to_the_next_nearest(build_runtime: Any) -> None:
    upstreams = Upstreams(near="503")
    peers = (
        PeerSpec("far", "http://far", "ap", 150.0),
        PeerSpec("near", "http://near", "eu", 80.0),
    )
    rt = await build_runtime(upstreams, replicas=(), peers=peers)
    response = await rt.dispatcher.dispatch(proxy_call())
    assert response.status_code == 200 and upstreams.hosts() == ["near", "far"]


async def test_a_forwarded_request_is_never_forwarded_again(build_runtime: Any) -> None:
    upstreams = Upstreams()
    rt = await build_runtime(
        upstreams, replicas=(), peers=(PeerSpec("near", "http://near", "eu", 80.0),)
    )
    with pytest.raises(ApiError) as info:
        await rt.dispatcher.dispatch(proxy_call(forwarded=True))
    assert (info.value.status, info.value.code) == (503, "no_healthy_replica")
    assert info.value.headers == {"Retry-After": "2"}
    assert upstreams.calls == []


async def test_full_region_with_no_queue_room_is_429_and_empty_region_is_503(
    build_runtime: Any,
) -> None:
    no_queue = ModelSpec(MODEL, queue_max_len=0)
    full = await build_runtime(Upstreams(), replicas=("a",), max_outstanding=1, model=no_queue)
    target = full.router.target("a")
    lease = full.router.lease(proxy_call().descriptor, target)
    with pytest.raises(ApiError) as busy:
        await full.dispatcher.dispatch(proxy_call())
    assert (busy.value.status, busy.value.code) == (429, "queue_full")
    assert busy.value.headers["Retry-After"] == "2"
    assert full.metrics.queue_rejected.value(MODEL) == 1
    lease.release(ok=True)
    empty = await build_runtime(Upstreams(), replicas=())
    with pytest.raises(ApiError) as none:
        await empty.dispatcher.dispatch(proxy_call())
    assert none.value.status == 503 and none.value.code == "no_healthy_replica"
