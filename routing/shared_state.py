"""Redis glue for the state shared by the processes behind one balancer address.

``core.shared_state`` decides what is shared and how it merges; this
module carries it.  One exchange is one Lua script (``EVALSHA``), one round trip,
atomic on the store:

1. stamp this process's load snapshot with Redis's own clock (``TIME``: one
   clock for processes on several hosts) into the hash
   ``meridian:shared:{<balancer>}:loads``, and drop every field older than the
   peer TTL (a process that died);
2. append the routes decided since the last exchange to the stream
   ``meridian:shared:{<balancer>}:routes`` (``XADD MAXLEN ~``: bounded);
3. answer the other live processes' snapshots and the log entries after this
   process's cursor (``XRANGE (cursor + COUNT``), less its own (it applied them
   when it decided), with the id of the last entry read: the next cursor.

The script also moves the balancer's version counter
(``meridian:shared:{<balancer>}:version``) when what siblings read changed, and
answers it.  The braces are a Redis Cluster hash tag: the keys of a balancer land
on one slot, which a script touching them needs.  An exchange runs in the
background, never inside a decision: every ``sync_s`` while this process or a
sibling has news, paced when idle (``ExchangePacer``: a ``GET`` of the counter,
the script as a heartbeat, the loop asleep until its own next decision); it is
bounded by ``timeout_s``, and any failure (refused, reset, timed out, a bad answer) turns the
view degraded: peers' load is dropped at once and routing goes on with the local
view, as one process would (``/metrics``: ``meridian_shared_state_degraded``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from core.metrics import MetricsRegistry
from core.router import LocalRouter
from core.shared_state import (
    ExchangePacer,
    LoggedRoute,
    ReplicaLoad,
    RouteRecord,
    SharedConfig,
    SharedStateError,
    SharedView,
    Step,
    SyncResult,
    decode_loads,
    decode_route,
    encode_loads,
    encode_route,
)

logger = logging.getLogger(__name__)

SYNC_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)

# KEYS: loads hash, routes stream, version counter.  The counter moves when what
# siblings read changed (a new snapshot, routes, a process dropped).  ARGV: process,
# its loads, peer TTL (ms), stream bound, cursor, read count, then one packed route
# record per argument.
EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl = ARGV[1], tonumber(ARGV[3])
local changed = #ARGV > 6
local mine = false
local peers = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  local bar = string.find(value, '|', 1, true)
  local at = bar and tonumber(string.sub(value, 1, bar - 1))
  if field == me then
    mine = true
    if not at or now - at > ttl or string.sub(value, bar + 1) ~= ARGV[2] then
      changed = true
    end
  elseif not at or now - at > ttl then
    redis.call('HDEL', KEYS[1], field)
    changed = true
  else
    peers[#peers + 1] = field
    peers[#peers + 1] = string.sub(value, bar + 1)
  end
end
if not mine then
  changed = true
end
redis.call('HSET', KEYS[1], me, now .. '|' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 4)
for i = 7, #ARGV do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'p', me, 'r', ARGV[i])
end
local version
if changed then
  version = redis.call('INCR', KEYS[3])
else
  version = tonumber(redis.call('GET', KEYS[3]) or '0')
end
redis.call('PEXPIRE', KEYS[3], ttl * 4)
local read = redis.call('XRANGE', KEYS[2], '(' .. ARGV[5], '+', 'COUNT', ARGV[6])
local routes = {}
for i = 1, #read do
  local fields = read[i][2]
  if fields[1] ~= 'p' or fields[2] ~= me then
    routes[#routes + 1] = read[i]
  end
end
local last = #read > 0 and read[#read][1] or ''
return {peers, routes, last, #read, version}
"""


def loads_key(balancer: str) -> str:
    return f"meridian:shared:{{{balancer}}}:loads"


def routes_key(balancer: str) -> str:
    return f"meridian:shared:{{{balancer}}}:routes"


def version_key(balancer: str) -> str:
    return f"meridian:shared:{{{balancer}}}:version"


def shared_keys(balancer: str) -> list[str]:
    """Every key one balancer's processes share (for clean-up in tests and benches)."""
    return [loads_key(balancer), routes_key(balancer), version_key(balancer)]


def process_id() -> str:
    """Unique across hosts and restarts: host, pid, and a random tail."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class SharedStateMetrics:
    def __init__(self, r: MetricsRegistry) -> None:
        self.degraded = r.gauge(
            "meridian_shared_state_degraded",
            "1 while this process routes on its local view only (Redis slow or down).",
        )
        self.peers = r.gauge(
            "meridian_shared_state_peers",
            "Other live processes behind this balancer's address, as of the last exchange.",
        )
        self.staleness = r.gauge(
            "meridian_shared_state_staleness_seconds",
            "Age of the siblings' load this process routes on (-1: never exchanged).",
        )
        self.errors = r.counter(
            "meridian_shared_state_sync_errors_total",
            "Exchanges with Redis that failed or timed out (each degrades the view).",
        )
        self.routes = r.counter(
            "meridian_shared_state_routes_total",
            "Route records: published by this process, learned from siblings, "
            "dropped from a full outbox, unreadable in the log.",
            ["outcome"],
        )
        self.exchanges = r.counter(
            "meridian_shared_state_exchanges_total",
            "Ticks that reached Redis: full exchanges, and idle checks of the version "
            "counter (one GET) that found nothing new.",
            ["kind"],
        )
        self.sync_seconds = r.histogram(
            "meridian_shared_state_sync_seconds",
            "Duration of one exchange with Redis (one round trip).",
            [],
            SYNC_BUCKETS,
        )


class SharedStateSync:
    """Exchanges this process's view with its siblings' through Redis."""

    def __init__(
        self,
        redis_url: str,
        *,
        balancer: str,
        router: LocalRouter,
        config: SharedConfig,
        registry: MetricsRegistry,
        process: str | None = None,
    ) -> None:
        self.view = SharedView(process or process_id(), config)
        self.config = config
        self.router = router
        self.keys = shared_keys(balancer)
        self.pacer = ExchangePacer(config)
        self.metrics = SharedStateMetrics(registry)
        self.metrics.degraded.set(1)
        self._redis = aioredis.Redis.from_url(
            redis_url,
            decode_responses=False,  # route records are packed bytes
            socket_timeout=config.timeout_s,
            socket_connect_timeout=config.timeout_s,
        )
        self._script = self._redis.register_script(EXCHANGE)
        self.last_error: str | None = None
        self._dropped_seen = 0
        # The load snapshot the last successful exchange published.
        self._sent_loads: str | None = None
        # The script's round trip alone (encoding this process's part included), as
        # opposed to the whole exchange, which also decodes and learns the siblings'.
        self.last_round_trip_s = 0.0
        self._wake = asyncio.Event()
        router.on_route = self._on_route

    def _on_route(self, record: RouteRecord) -> None:
        self.view.record_route(record)
        self._wake.set()  # an idle loop publishes the first decision at once

    async def wait_next(self) -> None:
        """Sleep until the next tick is due (``ExchangePacer.delay_s``): the sync period
        while busy, longer while idle, cut short by a decision of this process."""
        config, view = self.config, self.view
        delay = self.pacer.delay_s(time.monotonic(), degraded=view.degraded)
        self._wake.clear()
        # Busy (checks at the fast period) or due soon: the plain period, so that the
        # decisions of a busy process are batched into one exchange per period.
        if view.pending or self.pacer.interval <= config.sync_s or delay <= config.sync_s:
            await asyncio.sleep(config.sync_s)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def tick(self) -> bool:
        """One tick of the sync loop, paced (``ExchangePacer``): the full exchange when
        something changed here or a sibling published, otherwise at most a version
        check.  False when the exchange or the check failed."""
        now = time.monotonic()
        changed = self.view.pending > 0 or self._loads() != self._sent_loads
        step = self.pacer.step(now, local_changed=changed, degraded=self.view.degraded)
        if step is Step.CHECK:
            try:
                raw = await asyncio.wait_for(self._redis.get(self.keys[2]), self.config.timeout_s)
                version = int(raw or 0)
            except (RedisError, OSError, TimeoutError, ValueError, TypeError):
                version = None  # the full exchange will fail and degrade the view
            step = self.pacer.on_check(now, version)
            if step is Step.WAIT:
                self.metrics.exchanges.inc("check")
        return await self.sync() if step is Step.FULL else True

    async def sync(self) -> bool:
        """One full exchange; True when it succeeded.  Never raises for a Redis failure."""
        view, sent = self.view, self.view.take_outbox()
        loads = self._loads()
        started = time.perf_counter()
        try:
            raw = await asyncio.wait_for(self._exchange(sent, loads), self.config.timeout_s)
            self.last_round_trip_s = time.perf_counter() - started
            result = _parse(raw, view.process)
        except (RedisError, OSError, TimeoutError, ValueError, TypeError) as exc:
            view.on_failure(sent)
            self.router.apply_peer_loads(view.peer_loads)  # {}: the local view only
            self._failed(exc)
            return False
        self.metrics.sync_seconds.observe(time.perf_counter() - started)
        self.metrics.exchanges.inc("full")
        now = time.monotonic()
        self._sent_loads = loads
        self.pacer.on_full(now, result.version)
        learned = view.on_success(now, result, len(sent))
        self.router.apply_peer_loads(view.peer_loads)
        for record in learned:
            self.router.learn_route(record)
        self._succeeded(len(sent), len(learned), result.unreadable)
        return True

    async def warm_start(self, budget_s: float) -> bool:
        """Replay the region's route log before taking traffic; False when Redis did
        not answer within ``budget_s`` (the process starts cold rather than not at all)."""
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            if not await self.sync():
                return False
            if self.view.caught_up:
                logger.info(
                    "shared state: warm start learned %d routes from %d sibling(s)",
                    self.view.applied,
                    self.view.peers,
                )
                return True
        return False

    def status(self) -> dict[str, object]:
        """For /health and the console."""
        view = self.view
        staleness = view.staleness_s(time.monotonic())
        return {
            "process": view.process,
            "degraded": view.degraded,
            "peers": view.peers,
            "staleness_s": None if staleness is None else round(staleness, 3),
            "warm": view.caught_up,
            "pending_routes": view.pending,
            "idle": self.pacer.idle,
            "full_exchanges": self.pacer.full_runs,
            "idle_checks": self.pacer.checks,
            "last_error": self.last_error,
        }

    def refresh_gauges(self) -> None:
        staleness = self.view.staleness_s(time.monotonic())
        self.metrics.staleness.set(-1.0 if staleness is None else staleness)

    async def close(self) -> None:
        await self._redis.aclose()

    def _loads(self) -> str:
        return encode_loads(self.router.local_loads())

    async def _exchange(self, sent: Sequence[RouteRecord], loads: str) -> object:
        view, config = self.view, self.config
        args: list[str | int | bytes] = [
            view.process,
            loads,
            int(config.peer_ttl_s * 1000),
            config.routes_maxlen,
            view.cursor,
            config.read_batch,
        ]
        for record in sent:
            try:
                args.append(encode_route(record))
            except SharedStateError as exc:  # a bug upstream: never retried, counted
                view.dropped += 1
                logger.warning("shared state: route not publishable, dropped: %s", exc)
        return await self._script(keys=self.keys, args=args)

    def _failed(self, exc: BaseException) -> None:
        self.metrics.errors.inc()
        self.metrics.degraded.set(1)
        self.metrics.peers.set(0)
        if self.last_error is None:
            logger.warning("shared state: Redis unavailable (%r); routing on the local view", exc)
        self.last_error = repr(exc)

    def _succeeded(self, sent: int, learned: int, unreadable: int) -> None:
        if self.last_error is not None:
            logger.info("shared state: Redis answers again; sharing resumed")
        self.last_error = None
        self.metrics.degraded.set(0)
        self.metrics.peers.set(self.view.peers)
        self.metrics.routes.inc("published", amount=sent)
        self.metrics.routes.inc("learned", amount=learned)
        self.metrics.routes.inc("unreadable", amount=unreadable)
        self.metrics.routes.inc("dropped", amount=self.view.dropped - self._dropped_seen)
        self._dropped_seen = self.view.dropped


def _parse(raw: object, process: str) -> SyncResult:
    """The script's answer as a ``SyncResult``; unreadable log records are counted, and
    this ``process``'s own records are skipped (the script leaves them out already), as
    are repeats of a record already in this answer (nothing new to learn)."""
    if not isinstance(raw, list) or len(raw) != 5:
        raise SharedStateError(f"unexpected exchange answer: {raw!r:.80}")
    flat, entries, last, read, version = raw
    peers: dict[str, dict[str, ReplicaLoad]] = {}
    unreadable = 0
    for name, value in zip(flat[::2], flat[1::2], strict=True):
        try:
            peers[_text(name)] = decode_loads(value)
        except (SharedStateError, UnicodeDecodeError) as exc:
            unreadable += 1
            logger.warning("shared state: load of %r unreadable, ignored: %s", name, exc)
    me = process.encode()
    seen: set[bytes] = set()
    routes: list[LoggedRoute] = []
    for entry_id, fields in entries:
        values = dict(zip(fields[::2], fields[1::2], strict=True))
        writer, record = values.get(b"p"), values.get(b"r")
        if writer == me or (record is not None and record in seen):
            continue
        try:
            if writer is None or record is None:
                raise SharedStateError("log entry lacks its p or r field")
            routes.append(LoggedRoute(_text(entry_id), _text(writer), decode_route(record)))
        except (SharedStateError, UnicodeDecodeError) as exc:
            unreadable += 1
            logger.warning("shared state: log entry %r unreadable, skipped: %s", entry_id, exc)
            continue
        seen.add(record)
    last_id = _text(last) or None
    return SyncResult(peers, routes, int(read), last_id, unreadable, int(version))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
