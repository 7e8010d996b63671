"""The per-process balancer runtime: topology in memory, background loops, shared client.

Why one runtime per process (``get_runtime``): daphne serves the Django ASGI app
on a single event loop and sends no lifespan events, so there is no start-up
hook; the first request creates the runtime and awaits its first topology
load.  Everything that must be shared by all requests of a process lives here:
the one ``httpx.AsyncClient`` (its connection pool is the point), the in-flight
ledger (a per-request copy would count nothing), the metrics, and the three
background loops:

* topology refresh every ``MERIDIAN_TOPOLOGY_REFRESH_S`` (the only ORM access);
* replica probe every ``MERIDIAN_PROBE_INTERVAL_S`` (``routing.prober``);
* heartbeat exchange every ``MERIDIAN_HEARTBEAT_INTERVAL_S`` (``routing.peers``).

The runtime is bound to the loop that created it; a different running loop (a
test harness that makes a fresh loop per call) gets a fresh runtime rather than
tasks and connections tied to a dead loop.  The pure core keeps no globals;
this module is the one place that does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError

from routing.core import errors
from routing.core.peers import Heartbeat, peer_view
from routing.core.policy import Policy
from routing.core.registry import UnknownPolicyError, build_policy
from routing.core.router import LocalRouter
from routing.core.tokenizer import Tokenizer, build_tokenizer
from routing.core.topology import TopologySnapshot
from routing.dispatch import Dispatcher
from routing.peers import PeerDirectory
from routing.prober import ReplicaProber
from routing.telemetry import BalancerMetrics
from routing.topology import BalancerNotConfiguredError, load_snapshot_async

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    """The settings the balancer reads, read once (the core never sees settings)."""

    balancer: str
    redis_url: str
    hash_seed: str
    tokenizer_json: str
    demo: bool
    topology_refresh_s: float
    probe_interval_s: float
    probe_timeout_s: float
    probe_failure_threshold: int
    heartbeat_interval_s: float
    heartbeat_ttl_s: float
    connect_timeout_s: float
    read_timeout_s: float
    max_attempts: int
    max_outstanding: int
    max_body_bytes: int
    retry_after_s: int
    peer_queue_buffer: int

    @classmethod
    def from_settings(cls) -> BalancerConfig:
        s = settings
        return cls(
            balancer=s.MERIDIAN_BALANCER,
            redis_url=s.REDIS_URL,
            hash_seed=s.MERIDIAN_HASH_SEED,
            tokenizer_json=s.MERIDIAN_TOKENIZER_JSON,
            demo=s.MERIDIAN_DEMO,
            topology_refresh_s=s.MERIDIAN_TOPOLOGY_REFRESH_S,
            probe_interval_s=s.MERIDIAN_PROBE_INTERVAL_S,
            probe_timeout_s=s.MERIDIAN_PROBE_TIMEOUT_S,
            probe_failure_threshold=s.MERIDIAN_PROBE_FAILURE_THRESHOLD,
            heartbeat_interval_s=s.MERIDIAN_HEARTBEAT_INTERVAL_S,
            heartbeat_ttl_s=s.MERIDIAN_HEARTBEAT_TTL_S,
            connect_timeout_s=s.MERIDIAN_UPSTREAM_CONNECT_TIMEOUT_S,
            read_timeout_s=s.MERIDIAN_UPSTREAM_READ_TIMEOUT_S,
            max_attempts=s.MERIDIAN_MAX_ATTEMPTS,
            max_outstanding=s.MERIDIAN_REPLICA_MAX_OUTSTANDING,
            max_body_bytes=s.MERIDIAN_MAX_BODY_BYTES,
            retry_after_s=s.MERIDIAN_RETRY_AFTER_S,
            peer_queue_buffer=s.MERIDIAN_PEER_QUEUE_BUFFER,
        )


def _policy_or_default(name: str, params: Mapping[str, Any]) -> Policy:
    """A bad ServiceConfig must not take a model offline: log it loudly, route least-load."""
    try:
        return build_policy(name, params)
    except (UnknownPolicyError, TypeError, ValueError) as exc:
        logger.error("policy %r with %r refused (%s); using least_load", name, params, exc)
        return build_policy("least_load")


class BalancerRuntime:
    def __init__(self, config: BalancerConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.tokenizer: Tokenizer = build_tokenizer(config.tokenizer_json or None)
        self.metrics = BalancerMetrics(config.balancer)
        self.router = LocalRouter(_policy_or_default, max_outstanding=config.max_outstanding)
        self.peers = PeerDirectory(
            config.redis_url,
            interval_s=config.heartbeat_interval_s,
            ttl_s=config.heartbeat_ttl_s,
        )
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s),
            # Long streams hold a connection each; httpx's default cap of 100 would
            # queue requests in the pool instead of on a replica.
            limits=httpx.Limits(max_connections=2048, max_keepalive_connections=256),
            # Replica and peer URLs are internal: never route them via an env proxy.
            trust_env=False,
        )
        self.dispatcher = Dispatcher(self)
        self.prober = ReplicaProber(
            self.client,
            self.router,
            self.metrics,
            timeout_s=config.probe_timeout_s,
            failure_threshold=config.probe_failure_threshold,
        )
        self.snapshot: TopologySnapshot | None = None
        self.topology_error: str | None = None
        self.dead_loops: dict[str, str] = {}
        self._start: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- start-up -----------------------------------------------------------------------

    async def ensure_started(self) -> None:
        if self.snapshot is not None and self._tasks:
            return
        failed = (
            self._start is not None
            and self._start.done()
            and (self._start.cancelled() or self._start.exception() is not None)
        )
        if self._start is None or failed:
            self._start = self.loop.create_task(self._first_start())
        try:
            # Shielded: a client that disconnects during start-up must not cancel it.
            await asyncio.shield(self._start)
        except (DatabaseError, BalancerNotConfiguredError) as exc:
            raise errors.balancer_unavailable(
                f"topology could not be loaded ({exc})", self.config.retry_after_s
            ) from exc

    async def _first_start(self) -> None:
        await self.refresh_topology(raise_errors=True)
        await self.prober.probe_all()
        self._tasks = [
            self._spawn("topology", self.config.topology_refresh_s, self.refresh_topology),
            self._spawn("probe", self.config.probe_interval_s, self.prober.probe_all),
            self._spawn("heartbeat", self.config.heartbeat_interval_s, self.exchange_heartbeats),
        ]
        await self.exchange_heartbeats()

    def _spawn(
        self, name: str, period: float, step: Callable[[], Awaitable[None]]
    ) -> asyncio.Task[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(period)
                await step()

        task = self.loop.create_task(loop(), name=f"meridian-{name}")
        task.add_done_callback(lambda t: self._loop_ended(name, t))
        return task

    def _loop_ended(self, name: str, task: asyncio.Task[None]) -> None:
        # A loop only ends on a bug (each step handles its expected failures): make
        # it loud in the log and visible on /health instead of routing on stale data.
        if task.cancelled():
            return
        exc = task.exception()
        self.dead_loops[name] = repr(exc)
        logger.error("background loop %s died", name, exc_info=exc)

    # -- background steps ---------------------------------------------------------------

    async def refresh_topology(self, *, raise_errors: bool = False) -> None:
        try:
            snapshot = await load_snapshot_async(self.config.balancer)
        except (DatabaseError, BalancerNotConfiguredError) as exc:
            if raise_errors:
                raise
            if self.topology_error is None:
                logger.warning("topology refresh failed, keeping the last snapshot: %s", exc)
            self.topology_error = str(exc)
            return
        self.router.apply(snapshot.replicas, snapshot.models)
        self.snapshot = snapshot
        self.topology_error = None

    async def exchange_heartbeats(self) -> None:
        snapshot = self.snapshot
        if snapshot is None:
            return
        await self.peers.exchange(
            self.heartbeat(snapshot),
            [p.name for p in snapshot.peers],
            self.metrics.heartbeat_errors.inc,
        )

    def heartbeat(self, snapshot: TopologySnapshot) -> Heartbeat:
        healthy, available = self.router.counts()
        return Heartbeat(
            balancer=snapshot.balancer,
            region=snapshot.region,
            url=snapshot.url,
            ts=time.time(),
            healthy_replicas=healthy,
            available_replicas=available,
            inflight=self.router.ledger.total,
            queue=0,
            models=self.router.available_by_model(),
        )

    # -- views' read side ---------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """This balancer's view, for ``GET /internal/state`` (console, control plane)."""
        snapshot = self.snapshot
        now = time.time()
        return {
            "balancer": self.config.balancer,
            "region": snapshot.region if snapshot else None,
            "url": snapshot.url if snapshot else None,
            "ts": now,
            "topology_loaded_at": snapshot.loaded_at if snapshot else None,
            "topology_error": self.topology_error,
            "inflight": self.router.ledger.total,
            "queue": 0,
            "max_outstanding_per_replica": self.router.max_outstanding,
            "models": [
                {"model": m, "policy": self.router.policy_name(m)}
                for m in sorted(snapshot.served_models if snapshot else ())
            ],
            "replicas": [self._replica_row(t.target_id) for t in self.router.targets()],
            "peers": peer_view(
                snapshot.peers if snapshot else (),
                self.peers.heartbeats,
                now=now,
                max_age_s=self.config.heartbeat_ttl_s,
            ),
            "redis": {"connected": self.peers.connected, "last_error": self.peers.last_error},
            "dead_loops": dict(self.dead_loops),
        }

    def _replica_row(self, name: str) -> dict[str, Any]:
        target = self.router.target(name)
        assert target is not None  # rows are built from router.targets()
        usage = self.router.usage(name)
        return {
            "name": name,
            "url": target.url,
            "model": target.model,
            "region": target.region,
            "zone": target.zone,
            "kind": target.kind,
            "healthy": target.healthy,
            "outstanding": target.outstanding,
            "running": target.running,
            "waiting": target.waiting,
            "kv_usage": target.kv_usage,
            "prefix_hit_rate": target.extra.get("prefix_hit_rate"),
            "consecutive_failures": target.consecutive_failures,
            "requests": usage.requests,
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_token_ratio": usage.cached_ratio,
        }

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.client.aclose()
        await self.peers.close()


_runtime: BalancerRuntime | None = None


def current_runtime() -> BalancerRuntime | None:
    """The runtime if this process is a balancer and has started one (no side effects)."""
    return _runtime


async def get_runtime() -> BalancerRuntime:
    """This process's runtime, created and started on first use.

    Raises ``ApiError`` (503) in a process that plays no balancer (the console),
    or while the topology cannot be loaded.
    """
    global _runtime
    if not settings.MERIDIAN_BALANCER:
        raise errors.not_a_balancer()
    loop = asyncio.get_running_loop()
    if _runtime is None or _runtime.loop is not loop:
        _runtime = BalancerRuntime(BalancerConfig.from_settings(), loop)
    await _runtime.ensure_started()
    return _runtime
