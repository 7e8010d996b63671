"""The per-process balancer runtime: topology in memory, background loops, shared client.

Why one runtime per process (``get_runtime``): daphne serves the Django ASGI app
on a single event loop and sends no lifespan events, so there is no start-up
hook; the first request creates the runtime and awaits its first topology
load.  Everything that must be shared by all requests of a process lives here:
the one ``httpx.AsyncClient`` (its connection pool is the point), the in-flight
ledgers (a per-request copy would count nothing), the dispatch core with its
regional queues and their pump, the transport, the metrics, and the background
loops:

* topology refresh every ``MERIDIAN_TOPOLOGY_REFRESH_S`` (the only ORM access): one
  row's token, and every table when it moved or every ``MERIDIAN_TOPOLOGY_FULL_REFRESH_S``;
* replica probe every ``MERIDIAN_PROBE_INTERVAL_S`` (``routing.prober``);
* peer availability poll every ``MERIDIAN_AVAILABILITY_INTERVAL_S`` over HTTP
  (``routing.peers.AvailabilityPoller``): what cross-region routing uses;
* Redis heartbeat every ``MERIDIAN_HEARTBEAT_INTERVAL_S`` (``routing.peers``):
  for the control plane and the console;
* KV events (``routing.kv_events``): subscriptions follow the topology refresh and
  queued events reach the cache maps every ``MERIDIAN_KV_EVENTS_BATCH_S``.

The two layers (``LocalRouter``, ``RemoteRouter``) call the pump's ``wake``
whenever a target may have become available, so queued requests leave at once.
This module is where the parts meet: the dispatcher and the pump receive their
collaborators (the core, the transport, the metrics, the prober's ``probe_soon``)
rather than the runtime, so nothing below imports it.

The runtime is bound to the loop that created it; a different running loop (a
test harness that makes a fresh loop per call) gets a fresh runtime rather than
tasks and connections tied to a dead loop.  The pure core keeps no globals;
this module is the one place that does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError

from core import errors
from core.auth_failures import AuthFailureLimiter
from core.backoff import RetryBackoff
from core.block_identity import (
    BLOCK_IDENTITY_KEY,
    BlockIdentityConfig,
    ModelBlockSchemes,
    parse_block_identity,
)
from core.breaker import BreakerConfig
from core.cache_view_check import MismatchConfig
from core.dispatch import DispatchCore, Ticket
from core.kv_events import split_kv_event_params
from core.kv_stream_health import SilenceConfig
from core.load_forecast import LoadForecast
from core.lora import AdapterDirectory
from core.peers import Heartbeat
from core.pending_queue import RegionalQueues
from core.policy import Policy
from core.probe_schedule import ProbeSchedule
from core.registry import UnknownPolicyError, build_policy, remote_policy_name
from core.remote import RemoteRouter, availability_report
from core.router import LocalRouter
from core.segments import DEFAULT_CACHE_TOKENS
from core.shared_state import SharedConfig
from core.topology import TopologySnapshot
from routing.cache_view import CacheViewMonitor
from routing.dispatch import Dispatcher
from routing.forecast import build_forecast
from routing.key_limits import KeyLimiter
from routing.kv_events import KVEventConsumer
from routing.live_publish import LivePublisher
from routing.model_tokens import ModelEncoders
from routing.peers import AvailabilityPoller, HttpReportFetch, PeerDirectory
from routing.prober import ReplicaProber
from routing.queue_pump import QueuePump, Waiter, alive
from routing.shared_state import SharedStateSync
from routing.telemetry import BalancerMetrics, QueueSnapshot, event_loop_name
from routing.topology import BalancerNotConfiguredError, refresh_snapshot_async
from routing.transport import (
    DemoLatency,
    PartitionedPolls,
    PartitionFault,
    PeerPartition,
    PoolTransport,
    Transport,
)
from routing.upstream_pool import UpstreamPool

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
    probe_stale_s: float = 2.0
    probe_idle_interval_s: float = 5.0
    probe_busy_grace_s: float = 3.0
    upstream_warm_connections: int = 8
    retry_backoff_s: float = 0.025
    retry_backoff_max_s: float = 0.5
    breaker_hold_down_s: float = 1.0
    breaker_max_hold_down_s: float = 30.0
    breaker_readmit_probes: int = 2
    probe_min_gap_s: float = 0.02
    availability_interval_s: float = 0.3
    availability_ttl_s: float = 2.0
    internal_token: str = ""
    kv_events_batch_s: float = 0.1
    kv_silent_probes: int = 10
    mismatch_window: int = 50
    mismatch_min_requests: int = 10
    mismatch_threshold: float = 0.5
    model_tokenizers: Mapping[str, str] = field(default_factory=dict)
    lora_adapters: Mapping[str, str] = field(default_factory=dict)
    tokenize_thread_chars: int = 16384
    tokenize_cache_tokens: int = DEFAULT_CACHE_TOKENS
    length_predictor: str = "learned"
    length_predictor_state: str = ""
    lookahead_iterations: int = 100
    seconds_per_iteration: float = 0.02
    live_publish_s: float = 1.0
    live_stream_maxlen: int = 4096
    auth_failure_limit: int = 20
    auth_failure_window_s: float = 60.0
    key_limits_timeout_s: float = 0.25
    key_limits_retry_s: float = 1.0
    key_slot_lease_s: float = 900.0
    shared_state: bool = False
    shared: SharedConfig = field(default_factory=SharedConfig)
    shared_warm_start_s: float = 3.0
    topology_full_refresh_s: float = 30.0

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
            topology_full_refresh_s=s.MERIDIAN_TOPOLOGY_FULL_REFRESH_S,
            probe_interval_s=s.MERIDIAN_PROBE_INTERVAL_S,
            probe_timeout_s=s.MERIDIAN_PROBE_TIMEOUT_S,
            probe_failure_threshold=s.MERIDIAN_PROBE_FAILURE_THRESHOLD,
            probe_busy_grace_s=s.MERIDIAN_PROBE_BUSY_GRACE_S,
            heartbeat_interval_s=s.MERIDIAN_HEARTBEAT_INTERVAL_S,
            heartbeat_ttl_s=s.MERIDIAN_HEARTBEAT_TTL_S,
            connect_timeout_s=s.MERIDIAN_UPSTREAM_CONNECT_TIMEOUT_S,
            read_timeout_s=s.MERIDIAN_UPSTREAM_READ_TIMEOUT_S,
            max_attempts=s.MERIDIAN_MAX_ATTEMPTS,
            max_outstanding=s.MERIDIAN_REPLICA_MAX_OUTSTANDING,
            max_body_bytes=s.MERIDIAN_MAX_BODY_BYTES,
            retry_after_s=s.MERIDIAN_RETRY_AFTER_S,
            peer_queue_buffer=s.MERIDIAN_PEER_QUEUE_BUFFER,
            probe_stale_s=s.MERIDIAN_PROBE_STALE_S,
            probe_idle_interval_s=s.MERIDIAN_PROBE_IDLE_INTERVAL_S,
            upstream_warm_connections=s.MERIDIAN_UPSTREAM_WARM_CONNECTIONS,
            retry_backoff_s=s.MERIDIAN_RETRY_BACKOFF_S,
            retry_backoff_max_s=s.MERIDIAN_RETRY_BACKOFF_MAX_S,
            breaker_hold_down_s=s.MERIDIAN_BREAKER_HOLD_DOWN_S,
            breaker_max_hold_down_s=s.MERIDIAN_BREAKER_MAX_HOLD_DOWN_S,
            breaker_readmit_probes=s.MERIDIAN_BREAKER_READMIT_PROBES,
            probe_min_gap_s=s.MERIDIAN_PROBE_MIN_GAP_S,
            availability_interval_s=s.MERIDIAN_AVAILABILITY_INTERVAL_S,
            availability_ttl_s=s.MERIDIAN_AVAILABILITY_TTL_S,
            internal_token=s.MERIDIAN_INTERNAL_TOKEN,
            kv_events_batch_s=s.MERIDIAN_KV_EVENTS_BATCH_S,
            kv_silent_probes=s.MERIDIAN_KV_SILENT_PROBES,
            mismatch_window=s.MERIDIAN_CACHE_MISMATCH_WINDOW,
            mismatch_min_requests=s.MERIDIAN_CACHE_MISMATCH_MIN_REQUESTS,
            mismatch_threshold=s.MERIDIAN_CACHE_MISMATCH_THRESHOLD,
            model_tokenizers=dict(s.MERIDIAN_MODEL_TOKENIZERS),
            lora_adapters=dict(s.MERIDIAN_LORA_ADAPTERS),
            tokenize_thread_chars=s.MERIDIAN_TOKENIZE_THREAD_CHARS,
            tokenize_cache_tokens=s.MERIDIAN_TOKENIZE_CACHE_TOKENS,
            length_predictor=s.MERIDIAN_LENGTH_PREDICTOR,
            length_predictor_state=s.MERIDIAN_LENGTH_PREDICTOR_STATE,
            lookahead_iterations=s.MERIDIAN_LOOKAHEAD_ITERATIONS,
            seconds_per_iteration=s.MERIDIAN_SECONDS_PER_ITERATION,
            live_publish_s=s.MERIDIAN_LIVE_PUBLISH_S,
            live_stream_maxlen=s.MERIDIAN_LIVE_STREAM_MAXLEN,
            auth_failure_limit=s.MERIDIAN_AUTH_FAILURE_LIMIT,
            auth_failure_window_s=s.MERIDIAN_AUTH_FAILURE_WINDOW_S,
            key_limits_timeout_s=s.MERIDIAN_KEY_LIMITS_TIMEOUT_S,
            key_limits_retry_s=s.MERIDIAN_KEY_LIMITS_RETRY_S,
            key_slot_lease_s=s.MERIDIAN_KEY_SLOT_LEASE_S,
            shared_state=s.MERIDIAN_SHARED_STATE,
            shared=SharedConfig(
                sync_s=s.MERIDIAN_SHARED_SYNC_S,
                timeout_s=s.MERIDIAN_SHARED_TIMEOUT_S,
                peer_ttl_s=max(s.MERIDIAN_SHARED_PEER_TTL_S, 2 * s.MERIDIAN_SHARED_SYNC_S),
                routes_maxlen=s.MERIDIAN_SHARED_ROUTES_MAXLEN,
                outbox_max=s.MERIDIAN_SHARED_OUTBOX_MAX,
                idle_check_s=_idle_check_s(s),
            ),
            shared_warm_start_s=s.MERIDIAN_SHARED_WARM_START_S,
        )


def _idle_check_s(s: Any) -> float:
    """The idle check period: 0 (off), or at least the sync period."""
    idle, sync = float(s.MERIDIAN_SHARED_IDLE_CHECK_S), float(s.MERIDIAN_SHARED_SYNC_S)
    return max(idle, sync) if idle else 0.0


def _policy_or_default(name: str, params: Mapping[str, Any]) -> Policy:
    """A bad ServiceConfig must not take a model offline: log it loudly, route least-load."""
    try:
        # The KV-event endpoints and the block identity are the consumer's business
        # (and describe's), not the policy's.
        _, policy_params = split_kv_event_params(params)
        policy_params.pop(BLOCK_IDENTITY_KEY, None)
        return build_policy(name, policy_params)
    except (UnknownPolicyError, TypeError, ValueError) as exc:
        logger.error("policy %r with %r refused (%s); using least_load", name, params, exc)
        return build_policy("least_load")


def _block_identity_or_default(model: str, params: Mapping[str, Any]) -> BlockIdentityConfig:
    """A bad block identity keeps the default (token_ids), loudly, like a bad policy."""
    try:
        return parse_block_identity(params.get(BLOCK_IDENTITY_KEY))
    except ValueError as exc:
        logger.error("model %s: %s; using the token_ids block identity", model, exc)
        return BlockIdentityConfig()


def _shared_client(config: BalancerConfig) -> httpx.AsyncClient:
    """The process's one httpx client: peer polls, KV-event discovery."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s),
        # Long streams hold a connection each; httpx's default cap of 100 would
        # queue requests in the pool instead of on a replica.
        limits=httpx.Limits(max_connections=2048, max_keepalive_connections=256),
        # Replica and peer URLs are internal: never route them via an env proxy.
        trust_env=False,
    )


class BalancerRuntime:
    def __init__(self, config: BalancerConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.encoders = ModelEncoders(
            config.model_tokenizers,
            fallback_tokenizer_json=config.tokenizer_json,
            thread_chars=config.tokenize_thread_chars,
            cache_tokens=config.tokenize_cache_tokens,
        )
        self.metrics = BalancerMetrics(config.balancer, event_loop_name(loop))
        self.router = LocalRouter(
            _policy_or_default,
            max_outstanding=config.max_outstanding,
            probe_stale_s=config.probe_stale_s,
            breaker=BreakerConfig(
                config.breaker_hold_down_s,
                max(config.breaker_hold_down_s, config.breaker_max_hold_down_s),
                config.breaker_readmit_probes,
            ),
        )
        self.remote = RemoteRouter(
            _policy_or_default,
            remote_policy_name,
            queue_buffer=config.peer_queue_buffer,
            max_age_s=config.availability_ttl_s,
        )
        self.queues: RegionalQueues[Ticket[Waiter]] = RegionalQueues()
        self.core: DispatchCore[Waiter] = DispatchCore(
            self.router,
            self.remote,
            self.queues,
            max_attempts=config.max_attempts,
            retry_after_s=config.retry_after_s,
            # Seeded from the OS: balancers must not jitter their retries in lockstep.
            backoff=RetryBackoff(
                config.retry_backoff_s,
                max(config.retry_backoff_s, config.retry_backoff_max_s),
                random.Random().random,
            ),
            probe_min_gap_s=config.probe_min_gap_s,
            alive=alive,
            forecast=build_forecast(
                config.length_predictor,
                state_path=config.length_predictor_state,
                horizon=config.lookahead_iterations,
                seconds_per_iteration=config.seconds_per_iteration,
            ),
        )
        self.peers = PeerDirectory(
            config.redis_url,
            interval_s=config.heartbeat_interval_s,
            ttl_s=config.heartbeat_ttl_s,
        )
        self.client = _shared_client(config)
        # The console's live feed: this balancer's per-second record, straight to Redis.
        self.live = LivePublisher(
            config.redis_url,
            maxlen=config.live_stream_maxlen,
            on_error=self.metrics.live_publish_errors.inc,
        )
        self.block_schemes = ModelBlockSchemes(config.hash_seed)
        # LoRA adapter -> base model: learned from the replicas' /v1/models, config on top.
        self.adapters = AdapterDirectory(config.lora_adapters)
        self.auth_failures = AuthFailureLimiter(
            config.auth_failure_limit, config.auth_failure_window_s
        )
        self.key_limiter = KeyLimiter(
            config.redis_url,
            self.metrics,
            timeout_s=config.key_limits_timeout_s,
            lease_s=config.key_slot_lease_s,
            retry_s=config.key_limits_retry_s,
        )
        # The relay path (every proxied request) uses a lean keep-alive pool: httpx's
        # pool bookkeeping grew with the number of open streams (docs/performance.md).
        # The probes' /metrics and /v1/models GETs go through it too; httpx stays for
        # peer polls and KV-event discovery, where its generality is worth it.
        self.upstream = UpstreamPool(
            connect_timeout_s=config.connect_timeout_s, read_timeout_s=config.read_timeout_s
        )
        self.prober = ReplicaProber(
            self.upstream,
            self.router,
            self.metrics,
            timeout_s=config.probe_timeout_s,
            failure_threshold=config.probe_failure_threshold,
            busy_grace_s=config.probe_busy_grace_s,
            schemes=self.block_schemes,
            adapters=self.adapters,
        )
        self.pump = QueuePump(self.core, loop, self.metrics, probe_soon=self.prober.probe_soon)
        self.router.on_change = self.remote.on_change = self.pump.wake
        self.partition = PeerPartition()  # drill_partition's fault, empty otherwise
        self.kv = KVEventConsumer(
            self.client,
            self.router,
            timeout_s=config.probe_timeout_s,
            silence=SilenceConfig(probes=config.kv_silent_probes),
            schemes=self.block_schemes,
        )
        self.prober.on_load = self.kv.observe_probe
        self.cache_view = CacheViewMonitor(
            self.kv,
            self.metrics,
            MismatchConfig(
                window=config.mismatch_window,
                min_requests=config.mismatch_min_requests,
                threshold=config.mismatch_threshold,
            ),
        )
        self.dispatcher = Dispatcher(
            self.core,
            self.pump,
            self._transport(),
            self.metrics,
            balancer=config.balancer,
            loop=loop,
            cache_view=self.cache_view,
            internal_token=config.internal_token,
        )
        self.poller = AvailabilityPoller(
            self._report_fetch(), self.remote, on_error=self.metrics.availability_errors.inc
        )
        # Siblings behind the same address (docs/scale-out.md); None: this process alone.
        self.shared = (
            SharedStateSync(
                config.redis_url,
                balancer=config.balancer,
                router=self.router,
                config=config.shared,
                registry=self.metrics.registry,
            )
            if config.shared_state
            else None
        )
        self.snapshot: TopologySnapshot | None = None
        self._full_read_at = -math.inf
        self.topology_error: str | None = None
        self.dead_loops: dict[str, str] = {}
        self._start: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def _transport(self) -> Transport:
        """The relay pool, with the partition drill's fault and, in the demo, the RTT."""
        transport: Transport = PartitionFault(PoolTransport(self.upstream), self.partition)
        return DemoLatency(transport) if self.config.demo else transport

    def _report_fetch(self) -> PartitionedPolls:
        config = self.config
        fetch = HttpReportFetch(
            self.client,
            token=config.internal_token,
            # A poll must not outlive its own report's freshness.
            timeout_s=min(config.availability_ttl_s, max(0.2, config.availability_interval_s * 2)),
        )
        return PartitionedPolls(fetch, self.partition)

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

    async def _probe_and_warm(self) -> None:
        """A probe round, then keep ``upstream_warm_connections`` connections open (busy
        or idle) to every healthy replica, so a burst finds the pool warm."""
        await self.prober.probe_all()
        want = self.config.upstream_warm_connections
        if want > 0:
            healthy = [t.url for t in self.router.targets() if t.healthy]
            await asyncio.gather(*(self.upstream.warm(url, want) for url in healthy))

    async def _first_start(self) -> None:
        await self.refresh_topology(raise_errors=True)
        await self._probe_and_warm()
        if self.shared is not None:
            # Warm start: siblings' routes before the first request (never routing cold
            # while the region is warm); Redis down means a cold start, not no start.
            await self.shared.warm_start(self.config.shared_warm_start_s)
        self._tasks = [
            self._spawn("topology", self.config.topology_refresh_s, self.refresh_topology),
            self._spawn_probe_loop(),
            self._spawn("availability", self.config.availability_interval_s, self.poller.poll_all),
            self._spawn("heartbeat", self.config.heartbeat_interval_s, self.exchange_heartbeats),
            self._spawn("kv-subscribe", self.config.topology_refresh_s, self.kv.reconcile),
            self._spawn("kv-events", self.config.kv_events_batch_s, self.apply_kv_events),
            self._spawn("live", self.config.live_publish_s, self.publish_live),
        ]
        if self.shared is not None:
            self._tasks.append(self._spawn_paced("shared", self.shared))
        await asyncio.gather(
            self.poller.poll_all(), self.exchange_heartbeats(), self.kv.reconcile()
        )

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

    def _spawn_probe_loop(self) -> asyncio.Task[None]:
        """Probe rounds every ``probe_interval_s`` under traffic, less often idle; the
        first tick that sees traffic again probes at once (``core.probe_schedule``)."""
        config = self.config
        schedule = ProbeSchedule(
            config.probe_interval_s, max(config.probe_interval_s, config.probe_idle_interval_s)
        )

        async def loop() -> None:
            while True:
                await asyncio.sleep(config.probe_interval_s)
                # An unhealthy replica keeps the base interval: readmitting it waits on probes.
                busy = (
                    self.inflight() > 0
                    or self.queues.total() > 0
                    or not all(t.healthy for t in self.router.targets())
                )
                if schedule.tick(self.router.ledger.acquired, busy):
                    await self._probe_and_warm()

        task = self.loop.create_task(loop(), name="meridian-probe")
        task.add_done_callback(lambda t: self._loop_ended("probe", t))
        return task

    def _spawn_paced(self, name: str, shared: SharedStateSync) -> asyncio.Task[None]:
        """The shared-state loop: it sleeps as long as its pacer allows (idle: until the
        next check or heartbeat, or this process's next decision)."""

        async def loop() -> None:
            while True:
                await shared.wait_next()
                await shared.tick()

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
        """Check the topology token and read every table only when it moved (or every
        ``topology_full_refresh_s``, for writes that bypassed the token)."""
        started = self.loop.time()
        full = started - self._full_read_at >= self.config.topology_full_refresh_s
        try:
            snapshot, read_in_full = await refresh_snapshot_async(
                self.config.balancer, self.snapshot, full=full
            )
        except (DatabaseError, BalancerNotConfiguredError) as exc:
            if raise_errors:
                raise
            if self.topology_error is None:
                logger.warning("topology refresh failed, keeping the last snapshot: %s", exc)
            self.topology_error = str(exc)
            return
        if read_in_full:
            self.adopt(snapshot)
            self._full_read_at = started
        else:
            self.snapshot = snapshot  # the same topology, re-dated
        self.metrics.topology_reads.inc("full" if read_in_full else "checked")
        self.topology_error = None

    def adopt(self, snapshot: TopologySnapshot) -> None:
        """Make ``snapshot`` the topology of both layers and of the queues (no await)."""
        self.router.apply(snapshot.replicas, snapshot.models)
        names = [r.name for r in snapshot.replicas]
        self.cache_view.retain(names)
        self.kv.retain_views(names)
        self.core.forecast.retain(names)
        self.remote.apply(snapshot.peers, snapshot.models)
        for model, spec in snapshot.models.items():
            config = _block_identity_or_default(model, spec.policy_params)
            self.block_schemes.configure(model, config)
        self.queues.configure(
            {m: (spec.queue_max_len, spec.queue_max_wait_s) for m, spec in snapshot.models.items()}
        )
        self.snapshot = snapshot

    async def apply_kv_events(self) -> None:
        """The KV-event batch (002 §3.3: ~100 ms): apply what the streams brought, then
        judge the cache-view reports that waited for it."""
        await self.kv.flush_all()
        self.cache_view.after_batch()

    async def exchange_heartbeats(self) -> None:
        snapshot = self.snapshot
        if snapshot is None:
            return
        await self.peers.exchange(
            self.heartbeat(snapshot),
            [p.name for p in snapshot.peers],
            self.metrics.heartbeat_errors.inc,
            serving=self.prober.serving(),
        )

    async def publish_live(self) -> None:
        await self.live.publish(self)

    @property
    def forecast(self) -> LoadForecast:
        return self.core.forecast

    def monotonic(self) -> float:
        return self.loop.time()

    def heartbeat(self, snapshot: TopologySnapshot) -> Heartbeat:
        """This balancer's availability report (Algorithm 1, lines 9-10): available
        replicas and queue length per model, for peers and for Redis."""
        return availability_report(
            balancer=snapshot.balancer,
            region=snapshot.region,
            url=snapshot.url,
            ts=time.time(),
            local=self.router,
            remote=self.remote,
            queue_lengths=self.queues.lengths(),
        )

    def inflight(self) -> int:
        """Requests dispatched and not finished: to replicas and forwarded to peers."""
        return self.router.ledger.total + self.remote.ledger.total

    def queue_snapshots(self) -> list[QueueSnapshot]:
        """Every configured model's queue (empty ones too, so gauges read 0)."""
        now = self.loop.time()
        models = set(self.snapshot.models) if self.snapshot else set()
        queues = dict(self.queues.items())
        return [
            QueueSnapshot(m, len(q), q.oldest_wait(now))
            if (q := queues.get(m))
            else QueueSnapshot(m, 0, 0.0)
            for m in sorted(models | set(queues))
        ]

    def render_metrics(self) -> str:
        self.metrics.set_cache_health(self.kv.health.states, self.cache_view.detector.items())
        self.metrics.set_forecast(self.core.forecast.snapshot(self.loop.time()))
        if self.shared is not None:
            self.shared.refresh_gauges()
        return self.metrics.render(self.router, self.remote, self.queue_snapshots())

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        tasks = self._tasks
        await close_in_order(
            [
                ("background loops", lambda: asyncio.gather(*tasks, return_exceptions=True)),
                ("KV-event streams", self.kv.close),
                ("replica prober", self.prober.close),
                ("HTTP client", self.client.aclose),
                ("upstream pool", self.upstream.aclose),
                ("peer heartbeats", self.peers.close),
                ("live feed", self.live.close),
                ("key limits", self.key_limiter.close),
                *([("shared state", self.shared.close)] if self.shared is not None else []),
            ],
            timeout_s=CLOSE_STEP_TIMEOUT_S,
        )


# A shutdown step that outlives this is logged and left behind: a balancer told to
# stop must stop, whatever one dependency is waiting for.
CLOSE_STEP_TIMEOUT_S = 5.0


async def close_in_order(
    steps: list[tuple[str, Callable[[], Awaitable[object]]]], *, timeout_s: float
) -> list[str]:
    """Run each close step in turn, each bounded by ``timeout_s``; the names of the
    steps that did not finish in time (logged with what the process was waiting on)."""
    stuck: list[str] = []
    for name, step in steps:
        try:
            await asyncio.wait_for(step(), timeout_s)
        except TimeoutError:
            stuck.append(name)
            pending = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            logger.warning(
                "shutdown: %s did not close within %.0f s; going on without it (tasks: %s)",
                name,
                timeout_s,
                ", ".join(sorted(pending)) or "none",
            )
    return stuck


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
