"""The dispatcher's decisions, in process: retries, forwarding, and refusals.

A real ``BalancerRuntime`` with its topology set by hand and its shared client
replaced by an in-memory transport that plays replicas and peer balancers, so
each failure can be placed exactly (a 500 here, a reset there).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from routing.core.errors import ApiError
from routing.core.openai_request import Endpoint, describe, parse_request
from routing.core.peers import Heartbeat
from routing.core.tokenizer import WordTokenizer
from routing.core.topology import ModelSpec, PeerSpec, ReplicaSpec, TopologySnapshot
from routing.dispatch import HOP_HEADER, ProxyCall
from routing.runtime import BalancerConfig, BalancerRuntime
from tests.routing.conftest import MODEL

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]
OK_BODY = {
    "id": "x",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {
        "prompt_tokens": 20,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 16},
    },
}
SSE = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 1}}\n\n'
    b"data: [DONE]\n\n"
)


class Upstreams:
    """Replicas and peers by host name; each answers with what the test scripted."""

    def __init__(self, **behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        host = request.url.host
        mode = self.behaviour.get(host, "ok")
        if mode == "refuse":
            raise httpx.ConnectError("connection refused", request=request)
        if mode in {"500", "503", "429"}:
            return _response(int(mode), json.dumps({"error": {"message": mode}}).encode())
        if mode == "reset":
            return httpx.Response(200, stream=_ResetStream())
        if json.loads(request.content).get("stream"):
            return _response(200, SSE, content_type="text/event-stream")
        return _response(200, json.dumps(OK_BODY).encode(), {"X-Meridian-Replica": f"{host}-r"})

    def hosts(self) -> list[str]:
        return [r.url.host for r in self.calls]


def _response(
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> httpx.Response:
    """A response whose body arrives like a network one (streamed, not preloaded)."""
    return httpx.Response(
        status, stream=_Body(body), headers={"content-type": content_type, **(headers or {})}
    )


class _Body(httpx.AsyncByteStream):
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body


class _ResetStream(httpx.AsyncByteStream):
    async def __aiter__(self) -> Any:
        raise httpx.RemoteProtocolError("connection reset before the first byte")
        yield b""  # pragma: no cover - makes this an async generator


def _config(**overrides: Any) -> BalancerConfig:
    values: dict[str, Any] = {
        "balancer": "lb-us",
        "redis_url": "redis://127.0.0.1:1/0",
        "hash_seed": "meridian",
        "tokenizer_json": "",
        "demo": False,
        "topology_refresh_s": 1.0,
        "probe_interval_s": 1.0,
        "probe_timeout_s": 1.0,
        "probe_failure_threshold": 2,
        "heartbeat_interval_s": 1.0,
        "heartbeat_ttl_s": 5.0,
        "connect_timeout_s": 1.0,
        "read_timeout_s": 5.0,
        "max_attempts": 3,
        "max_outstanding": 4,
        "max_body_bytes": 1 << 20,
        "retry_after_s": 2,
        "peer_queue_buffer": 1,
    }
    return BalancerConfig(**{**values, **overrides})


@pytest.fixture
async def build() -> AsyncIterator[Callable[..., Awaitable[BalancerRuntime]]]:
    made: list[BalancerRuntime] = []

    async def make(
        upstreams: Upstreams,
        *,
        replicas: tuple[str, ...] = ("a", "b"),
        peers: tuple[PeerSpec, ...] = (),
        **config: Any,
    ) -> BalancerRuntime:
        rt = BalancerRuntime(_config(**config), asyncio.get_running_loop())
        await rt.client.aclose()
        rt.client = httpx.AsyncClient(transport=httpx.MockTransport(upstreams))
        specs = tuple(
            ReplicaSpec(n, f"http://{n}", MODEL, "us", "us-1", "reserved") for n in replicas
        )
        rt.snapshot = TopologySnapshot(
            balancer="lb-us",
            region="us",
            url="http://lb-us",
            replicas=specs,
            peers=peers,
            models={MODEL: ModelSpec(MODEL)},
            served_models=frozenset({MODEL}),
        )
        rt.router.apply(specs, rt.snapshot.models)
        rt.peers.heartbeats = {p.name: _beat(p.name) for p in peers}
        made.append(rt)
        return rt

    yield make
    for rt in made:
        await rt.close()


def _beat(name: str) -> Heartbeat:
    return Heartbeat(name, name, f"http://{name}", time.time(), 1, 1, 0, 0, {MODEL: 1})


def _call(*, stream: bool = False, forwarded: bool = False) -> ProxyCall:
    raw = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    ).encode()
    request = parse_request(raw, Endpoint.CHAT)
    descriptor = describe(
        request,
        WordTokenizer(),
        request_id="rid",
        session_key="10.0.0.9",
        hash_seed="meridian",
        forwarded=forwarded,
    )
    return ProxyCall(request, descriptor, raw, "Bearer mk-test", "rid", 0.0)


async def _drain(response: Any) -> bytes:
    return b"".join([chunk async for chunk in response])


async def test_failure_before_the_first_byte_retries_on_a_different_replica(build: Any) -> None:
    upstreams = Upstreams(a="500")
    rt = await build(upstreams)
    response = await rt.dispatcher.dispatch(_call())
    assert response.status_code == 200 and response["X-Meridian-Replica"] == "b"
    assert upstreams.hosts() == ["a", "b"]
    assert rt.router.target("a").healthy is False  # marked at once, not at the next probe
    assert rt.router.ledger.total == 0
    assert rt.metrics.retries.value(MODEL) == 1
    assert rt.router.usage("b").cached_tokens == 16


async def test_streaming_reset_before_the_first_byte_is_retried(build: Any) -> None:
    upstreams = Upstreams(a="reset")
    rt = await build(upstreams)
    response = await rt.dispatcher.dispatch(_call(stream=True))
    assert response["X-Meridian-Replica"] == "b"
    assert rt.router.ledger.total == 1  # held by the stream until it ends
    body = await _drain(response)
    assert b'"usage"' not in body and body.endswith(b"data: [DONE]\n\n")
    assert rt.router.ledger.total == 0
    assert rt.metrics.requests.value(MODEL, "200", "local") == 1


async def test_every_replica_failing_is_a_502_with_nothing_left_in_flight(build: Any) -> None:
    rt = await build(Upstreams(a="refuse", b="503"))
    with pytest.raises(ApiError) as info:
        await rt.dispatcher.dispatch(_call())
    assert (info.value.status, info.value.code) == (502, "upstream_error")
    assert rt.router.ledger.total == 0


async def test_a_busy_replica_is_skipped_but_not_marked_unhealthy(build: Any) -> None:
    upstreams = Upstreams(a="429")
    rt = await build(upstreams)
    response = await rt.dispatcher.dispatch(_call())
    assert response["X-Meridian-Replica"] == "b"
    assert rt.router.target("a").healthy is True


async def test_no_local_replica_forwards_to_the_nearest_peer_after_the_demo_rtt(
    build: Any,
) -> None:
    upstreams = Upstreams()
    peers = (
        PeerSpec("far", "http://far", "ap", 150.0),
        PeerSpec("near", "http://near", "eu", 80.0),
    )
    rt = await build(upstreams, replicas=(), peers=peers, demo=True)
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    rt.dispatcher.sleep = record
    call = _call()
    response = await rt.dispatcher.dispatch(call)
    assert response.status_code == 200
    assert upstreams.hosts() == ["near"] and slept == [0.08]
    sent = upstreams.calls[0]
    assert sent.headers[HOP_HEADER] == "lb-us"
    assert sent.headers["Authorization"] == "Bearer mk-test"
    assert sent.headers["X-Session-ID"] == "10.0.0.9"
    assert sent.content == call.raw_body  # the client's own body, not the replica's
    assert response["X-Meridian-Entry"] == "lb-us"
    assert response["X-Meridian-Replica"] == "near-r"
    assert rt.metrics.requests.value(MODEL, "200", "forwarded_out") == 1
    assert rt.router.ledger.total == 0


async def test_a_refusing_peer_falls_through_to_the_next_nearest(build: Any) -> None:
    upstreams = Upstreams(near="503")
    peers = (
        PeerSpec("far", "http://far", "ap", 150.0),
        PeerSpec("near", "http://near", "eu", 80.0),
    )
    rt = await build(upstreams, replicas=(), peers=peers)
    response = await rt.dispatcher.dispatch(_call())
    assert response.status_code == 200 and upstreams.hosts() == ["near", "far"]


async def test_a_forwarded_request_is_never_forwarded_again(build: Any) -> None:
    upstreams = Upstreams()
    rt = await build(upstreams, replicas=(), peers=(PeerSpec("near", "http://near", "eu", 80.0),))
    with pytest.raises(ApiError) as info:
        await rt.dispatcher.dispatch(_call(forwarded=True))
    assert (info.value.status, info.value.code) == (503, "no_healthy_replica")
    assert info.value.headers == {"Retry-After": "2"}
    assert upstreams.calls == []


async def test_full_region_without_peers_is_429_and_empty_region_is_503(build: Any) -> None:
    full = await build(Upstreams(), replicas=("a",), max_outstanding=1)
    target = full.router.target("a")
    lease = full.router.lease(_call().descriptor, target)
    with pytest.raises(ApiError) as busy:
        await full.dispatcher.dispatch(_call())
    assert (busy.value.status, busy.value.headers["Retry-After"]) == (429, "2")
    lease.release(ok=True)
    empty = await build(Upstreams(), replicas=())
    with pytest.raises(ApiError) as none:
        await empty.dispatcher.dispatch(_call())
    assert none.value.status == 503
