"""The balancer's live feed: a real runtime appends its per-second records to its
region's Redis stream, deltas against the last record sent, the stream bounded."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.conf import settings

from core.live_feed import FIELD, LiveRecord, decode_all, stream_key
from ops.embedded_redis import EmbeddedRedis
from tests.support.inprocess import proxy_call
from tests.support.upstreams import Upstreams

pytestmark = pytest.mark.anyio


def _records(client: redis.Redis) -> list[LiveRecord]:
    entries: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange(stream_key("us"))  # type: ignore[assignment]
    return decode_all(fields[FIELD.encode()] for _, fields in entries)


async def test_records_carry_the_growth_since_the_last_one_sent(
    build_runtime: Any, redis_server: EmbeddedRedis
) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(stream_key("us"))
    rt = await build_runtime(Upstreams(), redis_url=settings.REDIS_URL, live_stream_maxlen=100)
    await rt.publish_live()  # the first record marks the start: no growth known yet
    for _ in range(3):
        response = await rt.dispatcher.dispatch(proxy_call())
        assert response.status_code == 200
    await rt.publish_live()
    first, second = _records(client)
    assert first.delta.requests == 0 and first.seconds == 0
    assert (second.balancer, second.region) == ("lb-us", "us")
    assert second.delta.requests == 3 and second.delta.errors == 0
    assert second.delta.prompt_tokens > 0 and second.delta.cached_tokens > 0
    assert {r.name for r in second.replicas} == {"a", "b"}
    assert second.seconds > 0
    client.delete(stream_key("us"))
    client.close()


async def test_a_redis_outage_loses_no_growth(
    build_runtime: Any, redis_server: EmbeddedRedis
) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(stream_key("us"))
    rt = await build_runtime(Upstreams(), redis_url=settings.REDIS_URL)
    await rt.publish_live()
    healthy_redis = rt.live._redis
    rt.live._redis = redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0")  # nothing listens
    await rt.dispatcher.dispatch(proxy_call())
    await rt.publish_live()
    assert rt.live.failing and rt.metrics.live_publish_errors.total() == 1
    await rt.live._redis.aclose()
    rt.live._redis = healthy_redis
    await rt.dispatcher.dispatch(proxy_call())
    await rt.publish_live()
    records = _records(client)
    assert [r.delta.requests for r in records] == [0, 2]
    client.delete(stream_key("us"))
    client.close()


async def test_the_stream_stays_bounded(build_runtime: Any, redis_server: EmbeddedRedis) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(stream_key("us"))
    rt = await build_runtime(Upstreams(), redis_url=settings.REDIS_URL, live_stream_maxlen=100)
    for _ in range(400):
        await rt.publish_live()
    # MAXLEN ~ trims whole macro-nodes: never far past the bound, never unbounded.
    assert 100 <= client.xlen(stream_key("us")) < 300
    client.delete(stream_key("us"))
    client.close()
