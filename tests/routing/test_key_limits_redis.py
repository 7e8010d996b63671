"""Per-key limits on a real Redis: the admission script is atomic across limiters (one
per balancer process), slots come back once, tokens settle to the real usage, a dead
process's slots expire, and a Redis outage degrades to per-process limits without a
single refusal or error caused by the store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis
from django.conf import settings

from core.key_limits import Counts, KeyLimits, Verdict, decide, key_prefix
from core.sse import Usage
from ops.embedded_redis import EmbeddedRedis
from routing.key_limits import KeyGrant, KeyLimiter
from routing.telemetry import BalancerMetrics

pytestmark = pytest.mark.anyio

DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
async def limiters(
    redis_server: EmbeddedRedis,
) -> AsyncIterator[Callable[..., KeyLimiter]]:
    made: list[KeyLimiter] = []

    def make(url: str = "", **options: float) -> KeyLimiter:
        # A generous timeout: these tests are about atomicity, and a burst opens a
        # connection per concurrent call, which on a loaded machine can take long.
        options.setdefault("timeout_s", 5.0)
        limiter = KeyLimiter(url or settings.REDIS_URL, BalancerMetrics("lb-test"), **options)
        made.append(limiter)
        return limiter

    yield make
    for limiter in made:
        await limiter.close()


@pytest.fixture
def key_hash() -> Iterator[str]:
    """A fresh key per test; its Redis keys are removed afterwards."""
    value = uuid.uuid4().hex
    yield value
    client = redis.Redis.from_url(settings.REDIS_URL)
    for name in client.scan_iter(match=key_prefix(value).replace("{", "\\{") + "*"):
        client.delete(name)
    client.close()


async def test_concurrent_admissions_through_several_limiters_hold_the_limit_exactly(
    limiters: Callable[..., KeyLimiter], key_hash: str
) -> None:
    processes = [limiters() for _ in range(4)]
    limits = KeyLimits(requests_per_minute=25)
    grants = await asyncio.gather(
        *(processes[i % 4].admit(key_hash, "mk-t", limits, 1, f"r{i}") for i in range(60))
    )
    admissions = [g.admission for g in grants if g.admission is not None]
    by_window: dict[int, int] = {}
    for admission in admissions:
        if admission.admitted:
            by_window[admission.now_ms // 60_000] = by_window.get(admission.now_ms // 60_000, 0) + 1
    # Exactly the limit per minute window (a minute boundary may split the burst in two).
    assert all(count <= 25 for count in by_window.values())
    assert sum(by_window.values()) == (25 if len(by_window) == 1 else min(60, 25 * 2))
    refused = {a.verdict for a in admissions if not a.admitted}
    assert refused == {Verdict.REQUESTS}
    remaining = {int(g.headers["x-ratelimit-remaining-requests"]) for g in grants if g.headers}
    assert 0 in remaining


async def test_slots_come_back_once_and_usage_adds_up(
    limiters: Callable[..., KeyLimiter], key_hash: str
) -> None:
    a, b = limiters(), limiters()
    limits = KeyLimits(max_concurrent=2)
    first = await a.admit(key_hash, "mk-t", limits, 10, "r1")
    second = await b.admit(key_hash, "mk-t", limits, 10, "r2")
    third = await a.admit(key_hash, "mk-t", limits, 10, "r3")
    assert _verdicts(first, second, third) == [Verdict.ADMITTED] * 2 + [Verdict.CONCURRENCY]
    first.finish(Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=4))
    first.finish(Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=4))  # no-op
    await a.settled()
    fourth = await b.admit(key_hash, "mk-t", limits, 10, "r4")
    fifth = await b.admit(key_hash, "mk-t", limits, 10, "r5")
    assert _verdicts(fourth, fifth) == [Verdict.ADMITTED, Verdict.CONCURRENCY]
    second.finish(None)  # an error: no usage known, the request still counts
    fourth.finish(Usage(prompt_tokens=5, completion_tokens=1, cached_tokens=0))
    await b.settled()
    assert await a.usage(key_hash) == {
        "requests": 3,
        "prompt_tokens": 12,
        "cached_tokens": 4,
        "completion_tokens": 4,
    }
    assert a.metrics.key_requests.value("mk-t") == 1
    assert b.metrics.key_tokens.value("mk-t", "prompt") == 5


async def test_reserved_tokens_settle_to_the_real_usage(
    limiters: Callable[..., KeyLimiter], key_hash: str
) -> None:
    limiter = limiters()
    limits = KeyLimits(tokens_per_minute=1000, token_budget=10_000)
    grant = await limiter.admit(key_hash, "mk-t", limits, 600, "r1")
    assert grant.admission is not None and grant.admission.counts.tokens == 600
    refused = await limiter.admit(key_hash, "mk-t", limits, 600, "r2")
    assert refused.admission is not None and refused.admission.verdict is Verdict.TOKENS
    grant.finish(Usage(prompt_tokens=80, completion_tokens=20, cached_tokens=0))
    await limiter.settled()
    again = await limiter.admit(key_hash, "mk-t", limits, 600, "r3")
    assert again.admission is not None and again.admission.admitted
    if again.admission.now_ms // 60_000 == grant.admission.now_ms // 60_000:
        assert again.admission.counts.tokens == 700  # 100 real + 600 reserved
    assert again.admission.counts.budget == 700


async def test_a_dead_processes_slot_expires_with_its_lease(
    limiters: Callable[..., KeyLimiter], key_hash: str
) -> None:
    crashed, survivor = limiters(lease_s=0.3), limiters()
    limits = KeyLimits(max_concurrent=1)
    held = await crashed.admit(key_hash, "mk-t", limits, 1, "r1")  # never finished
    blocked = await survivor.admit(key_hash, "mk-t", limits, 1, "r2")
    assert _verdicts(held, blocked) == [Verdict.ADMITTED, Verdict.CONCURRENCY]
    await asyncio.sleep(0.4)
    after = await survivor.admit(key_hash, "mk-t", limits, 1, "r3")
    assert _verdicts(after) == [Verdict.ADMITTED]


async def test_the_script_decides_as_the_pure_core_does(
    limiters: Callable[..., KeyLimiter], key_hash: str
) -> None:
    limiter = limiters()
    limits = KeyLimits(requests_per_minute=4, tokens_per_minute=100, token_budget=150)
    counts = Counts()
    for reserve in (30, 30, 50, 20, 10, 1):
        expected = decide(limits, counts, reserve)
        grant = await limiter.admit(key_hash, "mk-t", limits, reserve, "r")
        assert grant.admission is not None
        if grant.admission.now_ms % 60_000 > 59_000:
            pytest.skip("a minute boundary fell inside the test")
        assert grant.admission.verdict is expected
        after = grant.admission.counts
        counts = Counts(after.requests, after.tokens, 0, after.budget)


async def test_redis_down_degrades_to_per_process_limits_and_keeps_the_usage(
    limiters: Callable[..., KeyLimiter], key_hash: str
) -> None:
    limiter = limiters(DEAD_REDIS, timeout_s=0.2, retry_s=60)
    limits = KeyLimits(requests_per_minute=2)
    grants = [await limiter.admit(key_hash, "mk-t", limits, 1, f"r{i}") for i in range(3)]
    assert _verdicts(*grants) == [Verdict.ADMITTED] * 2 + [Verdict.REQUESTS]
    assert not limiter.shared and limiter.metrics.key_limits_degraded.total() == 1
    assert limiter.metrics.key_limits_shared.value() == 0
    for grant in grants[:2]:
        grant.finish(Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=0))
    await limiter.settled()
    # Redis returns: the next finish of the key carries what was counted meanwhile.
    await limiter._redis.aclose()
    healthy = limiters()
    limiter._redis, limiter._admit, limiter._finish = (
        healthy._redis,
        healthy._admit,
        healthy._finish,
    )
    limiter._down_until = 0.0
    later = await limiter.admit(key_hash, "mk-t", KeyLimits(), 1, "r9")
    later.finish(Usage(prompt_tokens=1, completion_tokens=1, cached_tokens=1))
    await limiter.settled()
    assert await healthy.usage(key_hash) == {
        "requests": 3,
        "prompt_tokens": 21,
        "cached_tokens": 1,
        "completion_tokens": 11,
    }
    assert limiter.metrics.key_limits_shared.value() == 1


def _verdicts(*grants: KeyGrant) -> list[Verdict]:
    return [g.admission.verdict if g.admission else Verdict.ADMITTED for g in grants]


async def test_usage_of_keys_without_limits_goes_in_batches(
    limiters: Callable[..., KeyLimiter], key_hash: str
) -> None:
    a, b = limiters(), limiters()
    for i in range(50):
        limiter = (a, b)[i % 2]
        grant = await limiter.admit(key_hash, "mk-t", KeyLimits(), 5, f"r{i}")
        assert grant.admission is None and grant.headers == {}
        grant.finish(Usage(prompt_tokens=2, completion_tokens=1, cached_tokens=1))
    await a.settled()
    await b.settled()
    assert await a.usage(key_hash) == {
        "requests": 50,
        "prompt_tokens": 100,
        "cached_tokens": 50,
        "completion_tokens": 50,
    }
