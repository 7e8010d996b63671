"""The balancer's sub-second probe against real loopback replicas: what a good
``/metrics`` page, an error status, a refused connection and a page that comes late
each do to routing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from core.peers import serving_key
from ops.embedded_redis import EmbeddedRedis
from routing.calls import ProxyResponse
from tests.support.inprocess import proxy_call
from tests.support.loopback import Received, Reply
from tests.support.upstreams import SSE, Upstreams

pytestmark = pytest.mark.anyio


class MetricsStatus(Upstreams):
    """``/metrics`` of the replicas in ``failing`` answers with that status."""

    def __init__(self, **behaviour: str) -> None:
        super().__init__(**behaviour)
        self.failing: dict[str, int] = {}

    async def answer(self, request: Received) -> Reply:
        status = self.failing.get(request.server)
        if status and request.method == "GET" and request.path == "/metrics":
            return Reply(status, [b"busy"], content_type="text/plain")
        return await super().answer(request)


async def test_probes_record_load_and_count_failures_to_the_threshold(
    build_runtime: Any,
) -> None:
    upstreams = MetricsStatus(c="refuse")
    upstreams.running["a"], upstreams.waiting["a"] = 3, 2
    upstreams.failing["b"] = 503
    rt = await build_runtime(upstreams, replicas=("a", "b", "c"))  # failure threshold 2
    for _ in range(2):  # the second round reuses the first round's connections
        await rt.prober.probe_all()
        a = rt.router.target("a")
        assert a is not None and (a.running, a.waiting, a.healthy) == (3, 2, True)
    for name in ("b", "c"):
        target = rt.router.target(name)
        assert target is not None and not target.healthy
    assert [rt.metrics.probe_failures.value(n) for n in ("a", "b", "c")] == [0, 2, 2]
    upstreams.failing.clear()  # b's page recovers: after the breaker's hold-down
    await rt.prober.probe_all()  # (longer than this test) it takes good probes to readmit
    b = rt.router.target("b")
    assert b is not None and not b.healthy


class BusyReplica(Upstreams):
    """A replica whose ``/metrics`` answers ``metrics_late_s`` late (its status page
    waits behind its work, as vLLM's does under load), and whose streams send
    ``events`` token events ``interval_s`` apart and then fall silent (a hung engine)
    until the client leaves."""

    def __init__(self, metrics_late_s: float, events: int, interval_s: float) -> None:
        super().__init__()
        self.metrics_late_s, self.events, self.interval_s = metrics_late_s, events, interval_s

    async def answer(self, request: Received) -> Reply:
        if request.method == "GET" and request.path == "/metrics":
            await asyncio.sleep(self.metrics_late_s)
            return await super().answer(request)
        if request.method == "POST" and json.loads(request.content).get("stream"):
            self.calls.append(request)
            tokens = [SSE[0]] * self.events
            return Reply(200, tokens, "text/event-stream", stall=True, interval_s=self.interval_s)
        return await super().answer(request)


async def _read(response: ProxyResponse, got: list[bytes] | None = None) -> None:
    """Read the relayed stream as a client would, keeping what came in ``got``."""
    assert response.stream is not None
    async for chunk in response.stream:
        if got is not None:
            got.append(chunk)


async def test_a_late_probe_of_a_replica_still_streaming_is_no_failure(
    build_runtime: Any,
) -> None:
    # Token events 50 ms apart against a 2 s grace: a busy machine delays one by far less.
    upstreams = BusyReplica(metrics_late_s=0.6, events=1000, interval_s=0.05)
    rt = await build_runtime(
        upstreams, replicas=("a",), probe_timeout_s=0.1, probe_busy_grace_s=2.0
    )
    response = await rt.dispatcher.dispatch(proxy_call(stream=True))  # its first token is here
    got: list[bytes] = []
    reader = asyncio.create_task(_read(response, got))
    try:
        for late in (1, 2, 3):  # past the failure threshold (2): every probe times out
            before = len(got)
            await rt.prober.probe_all()
            assert len(got) > before  # tokens reached the client while the probe waited
            a = rt.router.target("a")
            assert a is not None and (a.healthy, a.late_probes) == (True, late)
        assert (rt.metrics.probe_late.value("a"), rt.metrics.probe_failures.value("a")) == (3, 0)
        assert not reader.done()  # the stream was flowing throughout
    finally:
        reader.cancel()


async def test_a_late_probe_counts_as_a_failure_once_the_replica_has_gone_quiet(
    build_runtime: Any,
) -> None:
    upstreams = BusyReplica(metrics_late_s=0.6, events=2, interval_s=0.0)  # then it hangs
    rt = await build_runtime(
        upstreams, replicas=("a",), probe_timeout_s=0.1, probe_busy_grace_s=0.3
    )
    response = await rt.dispatcher.dispatch(proxy_call(stream=True))
    reader = asyncio.create_task(_read(response))
    url, loop = await upstreams.url("a"), asyncio.get_running_loop()
    try:
        heard = rt.upstream.heard_from(url)
        assert heard is not None
        while loop.time() - heard < 0.3:  # until the silence outlasts the grace
            await asyncio.sleep(0.05)
            heard = rt.upstream.heard_from(url)
            assert heard is not None
        for _ in range(2):
            await rt.prober.probe_all()
        a = rt.router.target("a")
        assert a is not None and not a.healthy and a.late_probes == 0
        assert (rt.metrics.probe_late.value("a"), rt.metrics.probe_failures.value("a")) == (0, 2)
    finally:
        reader.cancel()


async def test_a_late_probe_of_a_replica_never_asked_anything_counts_as_a_failure(
    build_runtime: Any,
) -> None:
    upstreams = BusyReplica(metrics_late_s=0.6, events=1, interval_s=0.0)
    rt = await build_runtime(upstreams, replicas=("a",), probe_timeout_s=0.1)
    assert rt.upstream.heard_from(await upstreams.url("a")) is None
    for _ in range(2):
        await rt.prober.probe_all()
    a = rt.router.target("a")
    assert a is not None and not a.healthy
    assert (rt.metrics.probe_late.value("a"), rt.metrics.probe_failures.value("a")) == (0, 2)


async def test_a_replica_still_streaming_is_marked_serving_for_the_control_plane(
    build_runtime: Any, redis_server: EmbeddedRedis
) -> None:
    """The heartbeat's round trip also tells the control plane's readiness probe which
    replicas are busy rather than down (``workers.probes``), for the grace left."""
    upstreams = BusyReplica(metrics_late_s=0.0, events=1000, interval_s=0.05)
    names = ("serving-r1", "serving-r2")
    rt = await build_runtime(
        upstreams, replicas=names, probe_busy_grace_s=2.0, redis_url=redis_server.url
    )
    client = aioredis.Redis.from_url(redis_server.url)
    response = await rt.dispatcher.dispatch(proxy_call(stream=True))
    reader = asyncio.create_task(_read(response))
    try:
        (streaming,) = upstreams.hosts()
        (idle,) = set(names) - {streaming}
        await rt.exchange_heartbeats()
        assert 0 < await client.pttl(serving_key(streaming)) <= 2000  # its grace left
        assert await client.pttl(serving_key(idle)) == -2  # never asked anything: no mark
    finally:
        reader.cancel()
        await client.delete(*(serving_key(name) for name in names))
        await client.aclose()
