"""The balancer's side of the console's live feed: one record a second to Redis.

Every ``MERIDIAN_LIVE_PUBLISH_S`` the runtime's own loop reads this balancer's
counters and gauges (no HTTP, no other process involved), differences the counters
against the previous round (``core.live_feed``) and appends the record to its
region's stream with ``XADD ... MAXLEN ~ MERIDIAN_LIVE_STREAM_MAXLEN``, so the stream
holds about the last 15 minutes and never grows past its bound.

Best effort like the heartbeat: a Redis hiccup costs that second's record (the next
one carries the growth, as deltas are taken against the last record *sent*), is
counted in ``meridian_live_publish_errors_total`` and logged once per outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from core.cache_view_check import replica_warnings
from core.live_feed import (
    FIELD,
    Counters,
    LiveRecord,
    ReplicaLive,
    counters_delta,
    stream_key,
)
from core.load_forecast import LoadForecast
from core.remote import RemoteRouter
from core.router import LocalRouter
from core.topology import TopologySnapshot
from routing.cache_view import CacheViewMonitor
from routing.kv_events import KVEventConsumer
from routing.shared_state import SharedStateSync
from routing.telemetry import BalancerMetrics, QueueSnapshot


class LiveSource(Protocol):
    """What a record is read from: the balancer runtime (read-only, so the runtime
    passes itself without this module importing it)."""

    @property
    def snapshot(self) -> TopologySnapshot | None: ...
    @property
    def metrics(self) -> BalancerMetrics: ...
    @property
    def router(self) -> LocalRouter: ...
    @property
    def remote(self) -> RemoteRouter: ...
    @property
    def forecast(self) -> LoadForecast: ...
    @property
    def kv(self) -> KVEventConsumer: ...
    @property
    def cache_view(self) -> CacheViewMonitor: ...
    @property
    def shared(self) -> SharedStateSync | None: ...
    def monotonic(self) -> float: ...
    def inflight(self) -> int: ...
    def queue_snapshots(self) -> list[QueueSnapshot]: ...


logger = logging.getLogger(__name__)

FORWARDED_IN = "forwarded_in"
FORWARDED_OUT = "forwarded_out"
# Points of the look-ahead sparkline: enough for its shape, small in the stream.
SPARKLINE_POINTS = 20
# A stuck Redis must not hold the publishing loop past its next round.
REDIS_TIMEOUT_S = 1.0


def counters_now(rt: LiveSource) -> Counters:
    """The balancer's cumulative counters as of now."""
    m = rt.metrics
    requests = errors = forwarded_in = forwarded_out = 0.0
    for (_model, status, route), count in m.requests.items():
        requests += count
        errors += count if status.isdigit() and int(status) >= 500 else 0.0
        forwarded_in += count if route == FORWARDED_IN else 0.0
        forwarded_out += count if route == FORWARDED_OUT else 0.0
    return Counters(
        requests=requests,
        errors=errors,
        prompt_tokens=m.prompt_tokens.total(),
        cached_tokens=m.cached_tokens.total(),
        completion_tokens=m.completion_tokens.total(),
        forwarded_in=forwarded_in,
        forwarded_out=forwarded_out,
        ttft_counts=m.ttft.merged_counts(),
    )


def _warnings(rt: LiveSource, name: str) -> tuple[dict[str, str], ...]:
    """The same plain-language cache warnings ``/internal/state`` gives each replica."""
    return tuple(replica_warnings(rt.kv.health.states.get(name), rt.cache_view.view(name)))


def replica_rows(rt: LiveSource) -> tuple[ReplicaLive, ...]:
    rt.forecast.tick(rt.monotonic())  # the look-ahead maps as of now
    rows = []
    for target in rt.router.targets():
        name = target.target_id
        forecast = rt.forecast.replica(name)
        ahead = forecast.lookahead if forecast else ()
        step = max(1, len(ahead) // SPARKLINE_POINTS)
        rows.append(
            ReplicaLive(
                name=name,
                healthy=target.healthy,
                running=target.running,
                waiting=target.waiting,
                outstanding=target.outstanding,
                kv_usage=target.kv_usage,
                hit_rate=rt.router.usage(name).cached_ratio,
                anticipated_peak=forecast.peak_kv_tokens if forecast else None,
                lookahead=tuple(ahead[::step]),
                warnings=_warnings(rt, name),
            )
        )
    return tuple(rows)


class LivePublisher:
    """Appends this balancer's record to its region's stream, once per call."""

    def __init__(self, redis_url: str, *, maxlen: int, on_error: Callable[[], None]) -> None:
        self._redis = aioredis.Redis.from_url(
            redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        self.maxlen = maxlen
        self.on_error = on_error
        self.sent: tuple[float, Counters] | None = None  # (ts, counters) of the last record
        self.failing = False

    def record(self, rt: LiveSource, now: float, counters: Counters) -> LiveRecord | None:
        """This round's record against the last one sent; None before the topology."""
        snapshot = rt.snapshot
        if snapshot is None:
            return None
        before_ts, before = self.sent if self.sent else (now, None)
        queues = rt.queue_snapshots()
        targets = rt.router.targets()
        return LiveRecord(
            balancer=snapshot.balancer,
            region=snapshot.region,
            ts=now,
            seconds=max(now - before_ts, 0.0),
            delta=_growth(counters, before),
            inflight=rt.inflight(),
            forwarded_inflight=rt.remote.ledger.total,
            queue=sum(q.length for q in queues),
            oldest_wait_s=round(max((q.oldest_wait_s for q in queues), default=0.0), 3),
            waiting=sum(t.waiting for t in targets),
            ttft_buckets=rt.metrics.ttft.buckets,
            replicas=replica_rows(rt),
            process=rt.shared.view.process if rt.shared else "",
            shared_degraded=rt.shared.view.degraded if rt.shared else False,
        )

    async def publish(self, rt: LiveSource) -> None:
        now = time.time()
        counters = counters_now(rt)
        record = self.record(rt, now, counters)
        if record is None:
            return
        try:
            await self._redis.xadd(
                stream_key(record.region),
                {FIELD: record.to_json()},
                maxlen=self.maxlen,
                approximate=True,
            )
        except (RedisError, OSError) as exc:
            self.on_error()
            if not self.failing:
                logger.warning("live feed: Redis unavailable (%s); records dropped", exc)
            self.failing = True
            return
        if self.failing:
            logger.info("live feed: Redis reachable again")
        self.failing = False
        # Only a record that reached Redis moves the baseline: a dropped second's
        # growth is carried by the next record instead of being lost.
        self.sent = (now, counters)

    async def close(self) -> None:
        await self._redis.aclose()


def _growth(counters: Counters, before: Counters | None) -> Counters:
    return counters_delta(counters, before) if before is not None else _zero_like(counters)


def _zero_like(counters: Counters) -> Counters:
    """The first record of a process: it marks the start, its growth is not known."""
    return Counters(ttft_counts=(0,) * len(counters.ttft_counts))
