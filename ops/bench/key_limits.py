"""What a per-key limit costs a request: the admission script against a real Redis.

    manage.py bench key_limits --requests 5000 --processes 2

Each simulated balancer process (a ``KeyLimiter`` with its own connection, all on one
event loop) admits and finishes requests of one key with every limit set (requests and
tokens per minute, concurrency, budget), one request at a time per process, as a
balancer does on its path.  Printed: the admission's round trip as the balancer sees it
(p50, p99 µs), the balancer's CPU per admission plus finish (``time.process_time``),
and Redis's own CPU per script call (``INFO commandstats``).  One run, no assertions:
numbers for docs/performance.md, not a test.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from argparse import ArgumentParser
from typing import Any, TextIO

import redis
from django.conf import settings

from core.key_limits import MAX_LIMIT, KeyLimits, key_prefix
from core.sse import Usage
from routing.key_limits import KeyLimiter
from routing.telemetry import BalancerMetrics


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=5000, help="admissions per process")
    parser.add_argument("--processes", type=int, default=2, help="limiters sharing the key")
    parser.add_argument("--redis-url", default="", help="default: REDIS_URL")


def run(options: dict[str, Any], stdout: TextIO) -> None:
    requests, processes = int(options["requests"]), int(options["processes"])
    if requests < 100 or processes < 1:
        raise ValueError("--requests must be at least 100 and --processes at least 1")
    url = options.get("redis_url") or settings.REDIS_URL
    result = asyncio.run(_measure(url, requests, processes))
    for line in result:
        stdout.write(line)


async def _measure(url: str, requests: int, processes: int) -> list[str]:
    key_hash = f"bench-{uuid.uuid4().hex}"
    limits = KeyLimits(
        requests_per_minute=MAX_LIMIT,
        tokens_per_minute=MAX_LIMIT,
        max_concurrent=1_000_000,
        token_budget=MAX_LIMIT,
    )
    limiters = [KeyLimiter(url, BalancerMetrics(f"bench-{i}")) for i in range(processes)]
    usage = Usage(prompt_tokens=100, completion_tokens=20, cached_tokens=64)
    sync = redis.Redis.from_url(url)
    try:
        for limiter in limiters:  # load the scripts, open the connections
            grant = await limiter.admit(key_hash, "bench", limits, 120, "warm")
            grant.finish(usage)
            await limiter.settled()
        before = _evalsha(sync)  # a delta: the server's stats are not ours to reset
        waits: list[float] = []
        admit_cpu = [0.0]
        cpu_start = time.process_time()

        async def one(limiter: KeyLimiter) -> None:
            for i in range(requests):
                start, start_cpu = time.perf_counter(), time.process_time()
                grant = await limiter.admit(key_hash, "bench", limits, 120, f"r{i}")
                waits.append(time.perf_counter() - start)
                admit_cpu[0] += time.process_time() - start_cpu
                grant.finish(usage)
                await limiter.settled()

        await asyncio.gather(*(one(limiter) for limiter in limiters))
        cpu = time.process_time() - cpu_start
        after = _evalsha(sync)
        # A key without numeric limits: nothing to admit, its usage goes in batches.
        plain_start = time.process_time()
        for i in range(requests):
            grant = await limiters[0].admit(key_hash, "bench", KeyLimits(), 120, f"p{i}")
            grant.finish(usage)
        await limiters[0].settled()
        plain_cpu = (time.process_time() - plain_start) / requests
    finally:
        for limiter in limiters:
            await limiter.close()
        for name in sync.scan_iter(match=key_prefix(key_hash).replace("{", "\\{") + "*"):
            sync.delete(name)
        sync.close()
    total = requests * processes
    waits.sort()
    calls, usec = after[0] - before[0], after[1] - before[1]
    return [
        f"admissions: {total} ({processes} limiters x {requests}), every limit set",
        f"admission round trip (balancer side): p50 {_us(statistics.median(waits))} µs, "
        f"p99 {_us(waits[int(len(waits) * 0.99) - 1])} µs",
        f"balancer CPU per request (admit + finish, both scripts): {_us(cpu / total)} µs",
        f"  of which admission (exact with --processes 1): {_us(admit_cpu[0] / total)} µs",
        f"balancer CPU per request of a key without numeric limits: {_us(plain_cpu)} µs",
        "Redis CPU per script call (admit and finish alike): "
        f"{usec / max(1, calls):.1f} µs over {calls} calls (any other EVALSHA on this server "
        "during the run counts too)",
    ]


def _evalsha(client: redis.Redis) -> tuple[int, int]:
    """The server's EVALSHA calls and their total µs so far."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"
