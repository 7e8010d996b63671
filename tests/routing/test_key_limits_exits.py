"""A key's concurrency slot comes back on every way a request ends: an in-process runtime
on loopback upstreams and a real Redis, through the view's own ``hold_key`` and ``serve``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings

from core.errors import ApiError
from core.key_limits import KeyLimits, key_prefix
from core.topology import PeerSpec
from ops.embedded_redis import EmbeddedRedis
from routing.calls import ProxyCall
from routing.runtime import BalancerRuntime
from routing.views.completions import hold_key, serve
from tests.support.inprocess import proxy_call
from tests.support.upstreams import Upstreams

pytestmark = pytest.mark.anyio

LIMITS = KeyLimits(max_concurrent=5, tokens_per_minute=10**6)


@pytest.fixture
def key_hash(redis_server: EmbeddedRedis) -> Iterator[str]:
    value = uuid.uuid4().hex
    yield value
    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in client.scan_iter(match=key_prefix(value).replace("{", "\\{") + "*"):
        client.delete(name)
    client.close()


async def _held(rt: BalancerRuntime, key_hash: str, **options: Any) -> ProxyCall:
    call = proxy_call(rid=uuid.uuid4().hex, **options)
    await hold_key(rt, call, key_hash, LIMITS, prompt=10)
    assert await _slots(rt, key_hash) == 1
    return call


async def _slots(rt: BalancerRuntime, key_hash: str) -> int:
    await rt.key_limiter.settled()
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return int(client.zcard(key_prefix(key_hash) + "c"))
    finally:
        client.close()


async def _usage(rt: BalancerRuntime, key_hash: str) -> dict[str, int]:
    await rt.key_limiter.settled()
    return await rt.key_limiter.usage(key_hash)


async def test_a_buffered_response_gives_the_slot_back_with_its_usage(
    build_runtime: Any, key_hash: str
) -> None:
    rt = await build_runtime(Upstreams(), redis_url=settings.REDIS_URL)
    call = await _held(rt, key_hash)
    response = await serve(rt, call)
    assert response.status_code == 200
    assert await _slots(rt, key_hash) == 0
    assert await _usage(rt, key_hash) == {
        "requests": 1,
        "prompt_tokens": 20,
        "cached_tokens": 16,
        "completion_tokens": 1,
    }


async def test_a_stream_read_to_the_end_or_cut_by_the_client_gives_it_back(
    build_runtime: Any, key_hash: str
) -> None:
    rt = await build_runtime(Upstreams(), redis_url=settings.REDIS_URL)
    whole = await serve(rt, await _held(rt, key_hash, stream=True))
    assert whole.stream is not None
    body = b"".join([chunk async for chunk in whole.stream])
    assert b"usage" not in body  # the client did not ask for it
    assert await _slots(rt, key_hash) == 0
    cut = await serve(rt, await _held(rt, key_hash, stream=True))
    assert cut.stream is not None
    iterator = aiter(cut.stream)
    await anext(iterator)
    # The client left: the server closes its iterator and drops the response,
    # whose relay is then closed by the loop's async-generator finalizer.
    await iterator.aclose()  # type: ignore[attr-defined]
    del iterator, cut
    gc.collect()
    await asyncio.sleep(0.05)
    assert await _slots(rt, key_hash) == 0
    assert (await _usage(rt, key_hash))["requests"] == 2


async def test_failed_upstreams_give_it_back(build_runtime: Any, key_hash: str) -> None:
    rt = await build_runtime(Upstreams(a="reset", b="reset"), redis_url=settings.REDIS_URL)
    with pytest.raises(ApiError) as caught:
        await serve(rt, await _held(rt, key_hash))
    assert caught.value.status == 502
    assert await _slots(rt, key_hash) == 0
    assert (await _usage(rt, key_hash))["requests"] == 1


async def test_a_client_gone_while_the_replica_works_gives_it_back(
    build_runtime: Any, key_hash: str
) -> None:
    upstreams = Upstreams(a="hold", b="hold")
    rt = await build_runtime(upstreams, redis_url=settings.REDIS_URL)
    call = await _held(rt, key_hash)
    task = asyncio.create_task(serve(rt, call))
    await asyncio.sleep(0.2)
    task.cancel()  # Django cancels the view on http.disconnect
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _slots(rt, key_hash) == 0
    upstreams.release(call.request_id)


async def test_a_forward_gives_it_back_with_the_peers_usage(
    build_runtime: Any, key_hash: str
) -> None:
    upstreams = Upstreams()
    rt = await build_runtime(
        upstreams,
        replicas=(),
        peers=(PeerSpec("lb-eu", "", "eu", 80.0),),
        redis_url=settings.REDIS_URL,
    )
    response = await serve(rt, await _held(rt, key_hash, stream=True))
    assert response.stream is not None
    body = b"".join([chunk async for chunk in response.stream])
    assert b"usage" not in body
    # The peer was asked for the usage, which the entry stripped for the client.
    forwarded = json.loads(upstreams.calls[-1].content)
    assert forwarded["stream_options"] == {"include_usage": True}
    assert upstreams.calls[-1].server == "lb-eu"
    assert await _slots(rt, key_hash) == 0
    assert await _usage(rt, key_hash) == {
        "requests": 1,
        "prompt_tokens": 20,
        "cached_tokens": 0,
        "completion_tokens": 1,
    }


async def test_a_forwarded_in_request_is_not_held_again(build_runtime: Any, key_hash: str) -> None:
    rt = await build_runtime(Upstreams(), redis_url=settings.REDIS_URL)
    call = proxy_call(forwarded=True)
    assert call.descriptor.forwarded and call.on_finish is None
    response = await serve(rt, call)  # what admit does for a forward: no hold_key
    assert response.status_code == 200
    assert await _usage(rt, key_hash) == {
        "requests": 0,
        "prompt_tokens": 0,
        "cached_tokens": 0,
        "completion_tokens": 0,
    }


async def test_redis_down_serves_under_per_process_limits(
    build_runtime: Any, key_hash: str
) -> None:
    rt = await build_runtime(Upstreams(), redis_url="redis://127.0.0.1:1/0")  # nothing there
    limits = KeyLimits(requests_per_minute=2)
    statuses = []
    for _ in range(3):
        call = proxy_call(rid=uuid.uuid4().hex)
        try:
            await hold_key(rt, call, key_hash, limits, prompt=10)
            statuses.append((await serve(rt, call)).status_code)
        except ApiError as error:
            statuses.append(error.status)
    assert statuses == [200, 200, 429]  # held in this process; never a 5xx
    assert rt.metrics.key_limits_shared.value() == 0
    assert rt.metrics.key_limits_degraded.total() >= 1
