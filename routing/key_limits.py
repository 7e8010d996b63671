"""Per-key limits and usage in Redis: one Lua script per admission, one per finish.

The decision is ``core.key_limits.decide``; ``ADMIT_SCRIPT`` runs the same checks
atomically next to the counters, so every balancer process and region sharing the Redis
at ``REDIS_URL`` sees one count.  Clock: Redis's own ``TIME`` (one clock for every
process; no skew between hosts).  Keys, per API key hash ``h`` (all under one hash tag):

* ``meridian:kl:{h}:r:<minute>`` and ``:t:<minute>``: requests and tokens admitted in a
  fixed one-minute window (expire after two minutes);
* ``:c``: a sorted set of the key's in-flight requests scored by lease expiry, so a
  process that dies holding slots frees them after ``MERIDIAN_KEY_SLOT_LEASE_S``;
* ``:b:<period>``: tokens in the budget period;
* ``:u``: the usage hash (``requests``, ``prompt_tokens``, ``cached_tokens``,
  ``completion_tokens``) since the key was issued, which ``workers.key_usage`` rolls up.

A grant (``KeyGrant``) is finished exactly once (later calls are no-ops), from every
exit: the dispatcher's settle (buffered response built; stream ended, finished or cut),
or the view when dispatch raised (refused, client gone, internal error).  Finishing
releases the slot, settles the reserved tokens to the real usage and adds the usage,
in one script, off the request path.  A key without numeric limits holds nothing in
Redis: its usage is added in batches, every key's in one pipelined round trip every
``flush_s`` (0.2 s; a process killed meanwhile loses at most that much of the count).
A request a peer forwarded to this balancer is neither admitted nor counted here: the
balancer it entered did both.

Redis unreachable: limits degrade open to a process-local ``LocalLedger`` (each process
enforces the limits on its own, so N processes admit up to N times a limit), usage is
kept in memory and added to Redis with the key's next successful finish, and Redis is
tried again after ``MERIDIAN_KEY_LIMITS_RETRY_S``.  A request is never refused, and never
answered 5xx, because the store is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from core.key_limits import (
    USAGE_FIELDS,
    WINDOW_MS,
    Admission,
    KeyLimits,
    LocalLedger,
    admission_from_reply,
    key_prefix,
    rate_limit_headers,
    usage_key,
)
from core.sse import Usage
from routing.telemetry import BalancerMetrics

logger = logging.getLogger(__name__)

# KEYS[1] prefix; ARGV rpm, tpm, concurrent, budget (-1: none), budget period ms,
# reserve, member, lease ms.  Reply: verdict, requests, tokens, concurrent, budget, now ms.
ADMIT_SCRIPT = """
local p = KEYS[1]
local rpm, tpm, conc, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4])
local period_ms, reserve, member, lease_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7],
  tonumber(ARGV[8])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local win = math.floor(now / 60000)
local rk, tk, ck = p .. 'r:' .. win, p .. 't:' .. win, p .. 'c'
local bk = p .. 'b:' .. math.floor(now / period_ms)
redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
local r = tonumber(redis.call('GET', rk) or '0')
local tok = tonumber(redis.call('GET', tk) or '0')
local c = redis.call('ZCARD', ck)
local b = tonumber(redis.call('GET', bk) or '0')
local v = 0
if conc >= 0 and c >= conc then v = 1
elseif rpm >= 0 and r + 1 > rpm then v = 2
elseif tpm >= 0 and tok + reserve > tpm then v = 3
elseif budget >= 0 and b + reserve > budget then v = 4
end
if v == 0 then
  r = redis.call('INCR', rk)
  redis.call('PEXPIRE', rk, 120000)
  tok = redis.call('INCRBY', tk, reserve)
  redis.call('PEXPIRE', tk, 120000)
  if budget >= 0 then
    b = redis.call('INCRBY', bk, reserve)
    redis.call('PEXPIRE', bk, period_ms + 60000)
  end
  if conc >= 0 then
    redis.call('ZADD', ck, now + lease_ms, member)
    redis.call('PEXPIRE', ck, lease_ms)
    c = c + 1
  end
end
return {v, r, tok, c, b, now}
"""

# KEYS[1] prefix; ARGV member ('' for none), minute, budget period index, reserved,
# actual (-1: unknown, keep the reservation), then the usage increments (USAGE_FIELDS).
FINISH_SCRIPT = """
local p = KEYS[1]
if ARGV[1] ~= '' then redis.call('ZREM', p .. 'c', ARGV[1]) end
local reserved, actual = tonumber(ARGV[4]), tonumber(ARGV[5])
if actual >= 0 and reserved >= 0 and actual ~= reserved then
  local tk, bk = p .. 't:' .. ARGV[2], p .. 'b:' .. ARGV[3]
  if redis.call('EXISTS', tk) == 1 then redis.call('INCRBY', tk, actual - reserved) end
  if redis.call('EXISTS', bk) == 1 then redis.call('INCRBY', bk, actual - reserved) end
end
local u = p .. 'u'
redis.call('HINCRBY', u, 'requests', ARGV[6])
redis.call('HINCRBY', u, 'prompt_tokens', ARGV[7])
redis.call('HINCRBY', u, 'cached_tokens', ARGV[8])
redis.call('HINCRBY', u, 'completion_tokens', ARGV[9])
return 1
"""


def _none(limit: int | None) -> int:
    return -1 if limit is None else limit


@dataclass(eq=False)
class KeyGrant:
    """One admitted request's hold on its key: finish it once, with the usage if known."""

    limiter: KeyLimiter
    key_hash: str
    label: str
    reserve: int
    member: str  # its entry among the key's holds ("" when nothing is held)
    admission: Admission | None  # None: the key has no numeric limit (usage only)
    shared: bool  # admitted in Redis (else in the process-local ledger)
    done: bool = False

    @property
    def headers(self) -> dict[str, str]:
        return rate_limit_headers(self.admission) if self.admission is not None else {}

    def finish(self, usage: Usage | None) -> None:
        if self.done:
            return
        self.done = True
        self.limiter.finished(self, usage)


@dataclass
class KeyLimiter:
    """The balancer process's side of the per-key limits (one per runtime)."""

    redis_url: str
    metrics: BalancerMetrics
    timeout_s: float = 0.25
    lease_s: float = 900.0
    retry_s: float = 1.0
    max_connections: int = 16
    flush_s: float = 0.2  # usage of requests with nothing to settle goes in batches this often
    local: LocalLedger = field(default_factory=LocalLedger)
    _down_until: float = 0.0
    _backlog: dict[str, list[int]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _flusher: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        # A bounded pool that calls wait for: a burst of admissions must not open a
        # connection each (on a loaded host the connects alone outlast the timeout).
        pool = aioredis.BlockingConnectionPool.from_url(
            self.redis_url,
            max_connections=self.max_connections,
            timeout=self.timeout_s,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
        )
        self._redis = aioredis.Redis(connection_pool=pool)
        self._admit = self._redis.register_script(ADMIT_SCRIPT)
        self._finish = self._redis.register_script(FINISH_SCRIPT)
        self.metrics.key_limits_shared.set(1)

    @property
    def shared(self) -> bool:
        return time.monotonic() >= self._down_until

    async def admit(
        self, key_hash: str, label: str, limits: KeyLimits, reserve: int, request_id: str
    ) -> KeyGrant:
        """Take the request's place under its key's limits; ``grant.admission.admitted``
        says whether it got one (a refused grant holds nothing and needs no finish)."""
        if not limits.counted:
            # Nothing held: no member to name in any store.
            return KeyGrant(self, key_hash, label, reserve, "", None, shared=self.shared)
        member = f"{request_id}:{uuid.uuid4().hex[:12]}"
        if self.shared:
            try:
                reply = await self._admit(
                    keys=[key_prefix(key_hash)],
                    args=[
                        _none(limits.requests_per_minute),
                        _none(limits.tokens_per_minute),
                        _none(limits.max_concurrent),
                        _none(limits.token_budget),
                        limits.budget_period_s * 1000,
                        reserve,
                        member,
                        int(self.lease_s * 1000),
                    ],
                )
                admission = admission_from_reply(limits, reserve, list(reply))
                self.metrics.key_limits_shared.set(1)
                return KeyGrant(self, key_hash, label, reserve, member, admission, shared=True)
            except (TimeoutError, RedisError, OSError) as exc:
                self._degrade(exc)
        admission = self.local.admit(key_hash, limits, reserve, member, int(time.time() * 1000))
        return KeyGrant(self, key_hash, label, reserve, member, admission, shared=False)

    def finished(self, grant: KeyGrant, usage: Usage | None) -> None:
        """Count the usage here and settle the grant in its store (Redis off the request
        path, in a task the limiter keeps until it ends)."""
        amounts = [1, 0, 0, 0]
        if usage is not None:
            amounts = [1, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens]
            self.metrics.key_tokens.inc(grant.label, "prompt", amount=usage.prompt_tokens)
            self.metrics.key_tokens.inc(grant.label, "cached", amount=usage.cached_tokens)
            self.metrics.key_tokens.inc(grant.label, "completion", amount=usage.completion_tokens)
        self.metrics.key_requests.inc(grant.label)
        actual = usage.prompt_tokens + usage.completion_tokens if usage is not None else None
        if not grant.shared and grant.admission is not None:
            self.local.finish(grant.key_hash, grant.member, grant.reserve, actual)
        if grant.admission is None or not grant.shared:
            # Nothing to give back in Redis: the usage goes with the next batch.
            self._keep(grant.key_hash, amounts)
            if self._flusher is None or self._flusher.done():
                self._flusher = self._spawn(self._flush_later())
            return
        self._spawn(self._settle(grant, actual, amounts))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _flush_later(self) -> None:
        while self._backlog:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def flush(self) -> None:
        """Add the usage counted here to Redis: one pipelined round trip for every key."""
        if not self._backlog or not self.shared:
            return
        batch, self._backlog = self._backlog, {}
        pipe = self._redis.pipeline(transaction=False)
        for key_hash, amounts in batch.items():
            for name, amount in zip(USAGE_FIELDS, amounts, strict=True):
                if amount:
                    pipe.hincrby(usage_key(key_hash), name, amount)
        try:
            await pipe.execute()
            self.metrics.key_limits_shared.set(1)
        except (TimeoutError, RedisError, OSError) as exc:
            self._degrade(exc)
            for key_hash, amounts in batch.items():
                self._keep(key_hash, amounts)

    async def _settle(self, grant: KeyGrant, actual: int | None, amounts: list[int]) -> None:
        backlog = self._backlog.pop(grant.key_hash, None)
        if backlog is not None:
            amounts = [a + b for a, b in zip(amounts, backlog, strict=True)]
        if not self.shared:
            self._keep(grant.key_hash, amounts)
            return
        admission = grant.admission
        shared_slot = grant.shared and admission is not None
        now_ms = admission.now_ms if admission is not None else 0
        period_ms = admission.limits.budget_period_s * 1000 if admission is not None else WINDOW_MS
        try:
            await self._finish(
                keys=[key_prefix(grant.key_hash)],
                args=[
                    grant.member if shared_slot else "",
                    now_ms // WINDOW_MS,
                    now_ms // period_ms,
                    grant.reserve if shared_slot else -1,
                    -1 if actual is None or not shared_slot else actual,
                    *amounts,
                ],
            )
            self.metrics.key_limits_shared.set(1)
        except (TimeoutError, RedisError, OSError) as exc:
            self._degrade(exc)
            self._keep(grant.key_hash, amounts)
            # The slot, if any, stays until its lease ends: limits err on the safe side.

    def _keep(self, key_hash: str, amounts: list[int]) -> None:
        kept = self._backlog.setdefault(key_hash, [0, 0, 0, 0])
        for i, amount in enumerate(amounts):
            kept[i] += amount

    def _degrade(self, exc: BaseException) -> None:
        if self.shared:
            logger.warning(
                "key limits: Redis unavailable (%s); holding limits per process for %.1f s",
                exc,
                self.retry_s,
            )
        self.metrics.key_limits_degraded.inc()
        self.metrics.key_limits_shared.set(0)
        self._down_until = time.monotonic() + self.retry_s

    async def settled(self) -> None:
        """Wait for the finishes and the usage batch under way (bounded: while Redis is
        down the batch waits for it and this returns without it)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.flush_s + self.timeout_s * 4)

    async def usage(self, key_hash: str) -> dict[str, int]:
        """A key's usage counters in Redis (``USAGE_FIELDS``, zero when never used)."""
        raw = await self._redis.hgetall(usage_key(key_hash))
        return {name: int(raw.get(name.encode(), 0)) for name in USAGE_FIELDS}

    async def close(self) -> None:
        await self.settled()
        await self.flush()
        for task in self._tasks:
            task.cancel()
        await self._redis.aclose()
        await self._redis.connection_pool.disconnect()
