"""The balancer's KV-event consumer and anti-entropy sync (the push path, 002 §3-§4).

Why in the balancer, not a worker writing to Redis: the cache map lives in this
process's memory (``CacheMapPolicy.cache_map``, one per model) and is read on every
routing decision; 002 §3.3 applies evictions in ~100 ms batches, and a hop through
Redis plus a poll would add a round trip and a second copy to keep consistent for
nothing.  Each balancer subscribes only to the replicas it owns (after a failover
the adopting balancer subscribes at its next topology refresh), so the work scales
with regions, and a balancer without Redis keeps its map current.

* Discovery (every topology refresh, for the replicas of ``cache_map`` services):
  ``policy_params["kv_events"]`` names a replica's ZMQ endpoint, else the replica's
  ``GET /kv_event_sources`` (vLLM 0.32 and the emulated replica) says where it
  publishes and replays (``routing.kv_discovery``).  A replica without an answer,
  or one whose endpoint makes vLLM connect instead of bind, is asked again after
  ``discovery_retry_s``.
* Consumption: one SUB socket per replica (pyzmq asyncio); each message is decoded
  (``core.kv_events``), checked against the replica's sequence, and queued;
  ``flush`` (every ``MERIDIAN_KV_EVENTS_BATCH_S``) applies the queue in order, keyed
  under the model's block scheme (``core.event_keys``).  A store that cannot
  be keyed (``token_ids`` mode, parent never seen) is counted in ``orphans`` and,
  where the replica serves snapshots, resyncs it.
* Gaps: a skipped sequence number means lost messages (PUB drops past its
  high-water mark).  The steps of ``core.kv_stream_health.gap_plan`` run
  at once: the publisher's replay endpoint resends the lost messages
  (``routing.kv_replay``), else an anti-entropy sync, else the replica's entries
  are cleared (an empty view is honest; one with holes is not).
* Anti-entropy (002 §4.4; ``POST /internal/cache_sync`` from the Celery beat task
  ``sync_cache_state``, and gaps): ``GET <replica>/kv_cache/blocks`` returns the
  replica's cached block hashes and the sequence of its next message (the emulated
  replica serves it, with ``stored``: its blocks as BlockStored events, so
  ``token_ids`` mode can key blocks it missed; vLLM does not); the map's entries
  for that replica are replaced (``CacheMap.sync``) and queued messages below
  that sequence are dropped, since the snapshot already reflects them.
* Health (``routing.kv_health``): each probe's prefix-cache counters are compared
  with the events received, so a silent stream or a connect-instead-of-bind
  endpoint becomes a state a human sees (logs, ``/metrics``, the console).

``drop_next`` is a test hook: the next N messages are accepted (their sequence
numbers count) and their events thrown away, a loss no gap reveals, which only the
periodic sync can heal.  ``lose_next`` is its twin for gaps: the next N messages are
never seen, as when the PUB socket drops them, so the one after them reveals the gap
and healing starts (against a real vLLM, from its replay endpoint).  With
``fault_replica`` set, both take only that replica's messages: replicas of two
services on one engine subscribe to the same publisher, and which stream reads a
message first is a race.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import zmq
import zmq.asyncio

from core.block_identity import BlockScheme, ModelBlockSchemes
from core.cache_map import CacheMap
from core.engine_metrics import EngineLoad
from core.event_keys import CacheEventSink, EventKeys, apply_events, keys_for
from core.kv_events import (
    CacheEvent,
    EventBatch,
    KVEventDecodeError,
    SequenceTracker,
    decode_event,
    decode_message,
    split_kv_event_params,
)
from core.kv_stream_health import (
    STATE_ADVICE,
    GapStep,
    ProbeSample,
    SilenceConfig,
    gap_plan,
    replay_heals,
)
from core.policies.cache_map import CacheMapPolicy
from core.router import LocalRouter
from core.view_sink import ViewedSink, view_map
from routing.kv_discovery import Discovered, discover, from_config
from routing.kv_health import KVStreamHealth
from routing.kv_replay import ReplayUnavailableError, replay_from
from routing.upstream import join_url

logger = logging.getLogger(__name__)

BLOCKS_PATH = "/kv_cache/blocks"


@dataclass
class ReplicaStream:
    """One replica's subscription: its socket, sequence and not-yet-applied messages."""

    replica: str
    endpoint: str
    socket: zmq.asyncio.Socket
    replay_endpoint: str | None = None
    tracker: SequenceTracker = field(default_factory=SequenceTracker)
    pending: list[EventBatch] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None
    received: int = 0
    gaps: int = 0
    healed_by: dict[str, int] = field(default_factory=dict)  # gap step -> times it healed
    lost_from: int | None = None  # the first lost sequence of a gap not healed yet


@dataclass
class SyncResult:
    blocks: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """``GET /kv_cache/blocks``: the engine's block hashes, the sequence they are
    consistent with, and (emulated replica) the blocks re-described as stores."""

    blocks: list[int]
    sequence: int | None
    stored: list[CacheEvent]


class KVEventConsumer:
    def __init__(
        self,
        client: httpx.AsyncClient,
        router: LocalRouter,
        *,
        timeout_s: float,
        discovery_retry_s: float = 5.0,
        silence: SilenceConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        schemes: ModelBlockSchemes | None = None,
    ) -> None:
        self.client = client
        self.router = router
        self.schemes = schemes or ModelBlockSchemes()
        self.timeout_s = timeout_s
        self.discovery_retry_s = discovery_retry_s
        self.clock = clock
        self.streams: dict[str, ReplicaStream] = {}
        self.drop_next = 0
        self.lose_next = 0
        # The replica whose stream the two faults above apply to; None: the next
        # messages of any stream (two services on one engine share its publisher).
        self.fault_replica: str | None = None
        self.applied = 0
        self.syncs = 0
        self.last_sync: dict[str, SyncResult] = {}
        # Per replica: event hashes -> cache-map keys, and the stores that could not
        # be keyed (a parent never seen), which ask for a resync.
        self.keys: dict[str, EventKeys] = {}
        self.orphans: dict[str, int] = {}
        self._context = zmq.asyncio.Context.instance()
        self._asked: dict[str, float] = {}  # replica -> when discovery last found nothing
        self._heals: dict[str, asyncio.Task[None]] = {}
        self._resyncs: dict[str, asyncio.Task[SyncResult]] = {}  # after orphans
        self._syncing: set[str] = set()
        self._no_snapshot: set[str] = set()  # replicas whose /kv_cache/blocks is a 404
        self.health = KVStreamHealth(silence)
        # Per model whose policy's sink is not a cache map: that sink with a view map.
        self._views: dict[str, ViewedSink] = {}

    # -- which replicas ------------------------------------------------------------------

    def cache_map_policy(self, model: str) -> CacheMapPolicy | None:
        policy = self.router.policy(model)
        return policy if isinstance(policy, CacheMapPolicy) else None

    def sink(self, model: str) -> CacheEventSink | None:
        """Where ``model``'s events go: its policy's sink (``LocalRouter.kv_sink``), with
        a map of confirmed blocks beside it for the hit-rate mismatch detector unless
        that sink is such a map already (``core.view_sink``)."""
        sink = self.router.kv_sink(model)
        if sink is None or isinstance(sink, CacheMap):
            return sink
        viewed = self._views.get(model)
        if viewed is None or viewed.sink is not sink:
            # A new policy object starts from nothing, its view with it.
            viewed = self._views[model] = ViewedSink(sink, view_map())
        return viewed

    def view_map(self, model: str) -> CacheMap | None:
        """The confirmed blocks of ``model``'s replicas: the ``cache_map`` policy's own
        map, or the one kept beside another policy's sink; None: no events taken."""
        policy = self.cache_map_policy(model)
        if policy is not None:
            return policy.cache_map
        viewed = self._views.get(model)
        if viewed is None or viewed.sink is not self.router.kv_sink(model):
            return None
        return viewed.view

    def retain_views(self, replicas: list[str]) -> None:
        """The view maps forget replicas no longer served (a cache map policy's own
        map is told by its policy)."""
        for viewed in self._views.values():
            viewed.view.retain(replicas)

    def tracked(self) -> dict[str, tuple[str, str]]:
        """Owned replicas of services that take KV events (``LocalRouter.kv_sink``):
        name -> (url, configured endpoint)."""
        wanted: dict[str, tuple[str, str]] = {}
        for target in self.router.targets():
            spec = self.router.model_spec(target.model)
            if spec is None or self.router.kv_sink(target.model) is None:
                continue
            try:
                endpoints, _ = split_kv_event_params(spec.policy_params)
            except ValueError:
                endpoints = {}  # the policy builder already logged the bad config
            wanted[target.target_id] = (target.url, endpoints.get(target.target_id, ""))
        return wanted

    async def reconcile(self) -> None:
        """Subscribe to new owned replicas, unsubscribe from ones no longer owned."""
        wanted = self.tracked()
        for name in [n for n in self.streams if n not in wanted]:
            self._unsubscribe(name)
        self.health.retain(wanted)
        now = self.clock()
        due = [
            (name, url, configured)
            for name, (url, configured) in wanted.items()
            if name not in self.streams
            and now - self._asked.get(name, -1e9) >= self.discovery_retry_s
        ]
        found = await asyncio.gather(*(self._discover(url, c) for _, url, c in due))
        for (name, _, _), source in zip(due, found, strict=True):
            if source is not None and source.binds:
                self._subscribe(name, source)
            else:
                # Nothing to dial, or an address the engine connects to: nobody binds
                # it, so subscribing would wait forever.  Ask again later.
                self.health.unsubscribed(name, advertised_connect=source is not None)
                self._asked[name] = now

    async def _discover(self, url: str, configured: str) -> Discovered | None:
        if configured:
            return from_config(url, configured)
        return await discover(self.client, url, timeout_s=self.timeout_s)

    def _subscribe(self, name: str, source: Discovered) -> None:
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        socket.connect(source.endpoint)
        stream = ReplicaStream(name, source.endpoint, socket, source.replay_endpoint)
        stream.reader = asyncio.get_running_loop().create_task(
            self._read(stream), name=f"meridian-kv-{name}"
        )
        self.streams[name] = stream
        self._asked.pop(name, None)
        self.health.subscribed(name)
        replay = f", replay at {source.replay_endpoint}" if source.replay_endpoint else ""
        logger.info("KV events of %s: subscribed to %s%s", name, source.endpoint, replay)

    def _unsubscribe(self, name: str) -> None:
        stream = self.streams.pop(name)
        self.keys.pop(name, None)
        if stream.reader is not None:
            stream.reader.cancel()
        stream.socket.close(linger=0)

    # -- consumption ---------------------------------------------------------------------

    async def _read(self, stream: ReplicaStream) -> None:
        while True:
            frames = await stream.socket.recv_multipart()
            try:
                batch = decode_message(frames)
            except KVEventDecodeError as exc:
                logger.warning("KV events of %s: bad message skipped (%s)", stream.replica, exc)
                continue
            self.accept(stream, batch)

    def accept(self, stream: ReplicaStream, batch: EventBatch) -> None:
        """One decoded message: queue it, and start healing if messages were lost."""
        faulted = self.fault_replica in (None, stream.replica)
        if self.lose_next > 0 and faulted:
            self.lose_next -= 1
            return  # never seen: its sequence number is skipped, and the next shows the gap
        expected = stream.tracker.next_expected
        fresh, gap = stream.tracker.observe(batch.sequence)
        if not fresh:
            return
        stream.received += 1
        if gap and expected is not None:
            stream.gaps += 1
            lost = batch.sequence - expected
            logger.warning("KV events of %s: %d message(s) lost, healing", stream.replica, lost)
            stream.lost_from = min(expected, stream.lost_from or expected)
            self.heal_soon(stream)
        if self.drop_next > 0 and faulted:
            self.drop_next -= 1
            return
        stream.pending.append(batch)

    def flush(self, replica: str | None = None) -> None:
        """Apply every queued message (of one replica, or all) to its model's cache map."""
        if replica is None:
            streams = list(self.streams.values())
        else:
            streams = [s for s in (self.streams.get(replica),) if s is not None]
        for stream in streams:
            # A replica being synced or replayed keeps its queue: what arrives during the
            # snapshot's fetch may be newer than the snapshot, and the sync would
            # overwrite it; replayed messages must be applied before it.
            if not stream.pending or stream.replica in self._syncing:
                continue
            target = self.router.target(stream.replica)
            sink = self.sink(target.model) if target is not None else None
            batches, stream.pending = stream.pending, []
            if sink is None or target is None:
                continue
            keys = self.keys_of(sink, stream.replica, self.schemes.scheme(target.model))
            orphans = 0
            for batch in batches:
                applied = apply_events(sink, stream.replica, batch.events, keys)
                self.applied += applied.events
                orphans += applied.orphans
            if orphans:
                self._orphaned(stream.replica, orphans)

    def keys_of(self, sink: CacheEventSink, replica: str, scheme: BlockScheme) -> EventKeys:
        """The replica's event keying under ``scheme``; a changed scheme starts afresh
        (keys of the old scheme would never match a request again)."""
        keys = self.keys.get(replica)
        if keys is None or not keys.serves(scheme):
            if keys is not None:
                sink.clear(replica)
            keys = self.keys[replica] = keys_for(scheme)
        return keys

    def _orphaned(self, replica: str, count: int) -> None:
        self.orphans[replica] = self.orphans.get(replica, 0) + count
        logger.info("KV events of %s: %d stored event(s) chained to unknown blocks", replica, count)
        self._resync_soon(replica)

    def _resync_soon(self, replica: str) -> None:
        """A snapshot keys what the orphans could not (``stored``); an engine without
        one (vLLM) re-announces a reused prefix from its root, which keys it then."""
        if replica in self._no_snapshot or replica in self._resyncs:
            return
        task = asyncio.get_running_loop().create_task(self.sync_replica(replica))
        self._resyncs[replica] = task
        task.add_done_callback(lambda _t: self._resyncs.pop(replica, None))

    async def flush_all(self) -> None:
        """The batch loop's step (002 §3.3: apply events in ~100 ms batches)."""
        self.flush()

    # -- gaps ----------------------------------------------------------------------------

    def heal_soon(self, stream: ReplicaStream) -> None:
        """Start healing ``stream``'s gap unless a heal already runs (it takes the new
        gap's start too: ``lost_from`` is the earliest unhealed sequence)."""
        name = stream.replica
        if name not in self._heals:
            task = asyncio.get_running_loop().create_task(self._heal(stream))
            self._heals[name] = task
            task.add_done_callback(lambda _t: self._heals.pop(name, None))

    async def _heal(self, stream: ReplicaStream) -> None:
        while stream.lost_from is not None and self.streams.get(stream.replica) is stream:
            start, stream.lost_from = stream.lost_from, None
            plan = gap_plan(
                replay=stream.replay_endpoint is not None,
                snapshot=stream.replica not in self._no_snapshot,
            )
            for step in plan:
                if await self._try_step(stream, step, start):
                    stream.healed_by[step] = stream.healed_by.get(step, 0) + 1
                    logger.info("KV events of %s: gap healed by %s", stream.replica, step)
                    break

    async def _try_step(self, stream: ReplicaStream, step: GapStep, start: int) -> bool:
        if step is GapStep.REPLAY:
            return await self._replay(stream, start)
        if step is GapStep.SNAPSHOT:
            return (await self.sync_replica(stream.replica)).error is None
        # Forget everything believed of the replica, and what is queued from before
        # the loss too (a lost message may have undone it); what came after is true.
        stream.pending = [b for b in stream.pending if b.sequence > start]
        sink = self._sink_of(stream.replica)
        if sink is not None:
            sink.clear(stream.replica)
        self.flush(stream.replica)
        return True

    async def _replay(self, stream: ReplicaStream, start: int) -> bool:
        """Fetch the lost messages and queue them ahead of everything newer."""
        assert stream.replay_endpoint is not None
        self.flush(stream.replica)  # older than the loss: apply before replayed ones
        self._syncing.add(stream.replica)
        try:
            replayed = await replay_from(
                self._context, stream.replay_endpoint, start, timeout_s=self.timeout_s
            )
        except ReplayUnavailableError as exc:
            logger.warning("KV events of %s: replay failed (%s)", stream.replica, exc)
            return False
        finally:
            self._syncing.discard(stream.replica)
        if not replay_heals(start, [b.sequence for b in replayed]):
            return False
        # Messages at or past the first still queued came over the SUB socket already.
        first_queued = min((b.sequence for b in stream.pending), default=None)
        lost = [b for b in replayed if first_queued is None or b.sequence < first_queued]
        stream.pending[:0] = lost
        self.flush(stream.replica)
        return True

    def _sink_of(self, replica: str) -> CacheEventSink | None:
        target = self.router.target(replica)
        return self.sink(target.model) if target is not None else None

    # -- health ----------------------------------------------------------------------------

    def observe_probe(self, replica: str, load: EngineLoad) -> None:
        """A probe's prefix-cache counters against the events received since the last."""
        stream = self.streams.get(replica)
        if stream is None or load.prefix_queries is None:
            return  # nothing subscribed, or an engine without prefix-cache counters
        sample = ProbeSample(load.prefix_queries, load.prefix_hits or 0.0, stream.received)
        self.health.observe_probe(replica, sample)

    # -- anti-entropy --------------------------------------------------------------------

    async def sync_all(self) -> dict[str, SyncResult]:
        """Replace what the map believes of every tracked replica by its snapshot (a
        ``meridian`` tree is not synced: it holds paths, and a snapshot names blocks)."""
        names = sorted(
            name
            for name in self.tracked()
            if (target := self.router.target(name)) and self.cache_map_policy(target.model)
        )
        results = await asyncio.gather(*(self.sync_replica(n) for n in names))
        return dict(zip(names, results, strict=True))

    async def sync_replica(self, replica: str) -> SyncResult:
        target = self.router.target(replica)
        policy = self.cache_map_policy(target.model) if target is not None else None
        if target is None or policy is None:
            return SyncResult(error="not a cache_map replica of this balancer")
        self.flush(replica)  # what arrived before the snapshot is older than it
        self._syncing.add(replica)
        try:
            snapshot = await self._snapshot(target.url)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                self._no_snapshot.add(replica)  # vLLM: gaps skip straight past this step
            result = SyncResult(error=str(exc))
        except (httpx.HTTPError, ValueError, TypeError, KeyError) as exc:
            result = SyncResult(error=str(exc) or type(exc).__name__)
        else:
            scheme = self.schemes.scheme(target.model)
            result = self._adopt(policy, replica, scheme, snapshot)
        finally:
            self._syncing.discard(replica)
        self.last_sync[replica] = result
        return result

    async def _snapshot(self, url: str) -> Snapshot:
        response = await self.client.get(join_url(url, BLOCKS_PATH), timeout=self.timeout_s)
        response.raise_for_status()
        body: Any = response.json()
        blocks, sequence = body["blocks"], body.get("sequence")
        if not isinstance(blocks, list) or not all(isinstance(b, int) for b in blocks):
            raise ValueError("blocks must be a list of ints")
        try:
            stored = [e for e in map(decode_event, body.get("stored") or []) if e is not None]
        except KVEventDecodeError as exc:
            raise ValueError(f"stored: {exc}") from None
        return Snapshot(blocks, sequence if isinstance(sequence, int) else None, stored)

    def _adopt(
        self, policy: CacheMapPolicy, replica: str, scheme: BlockScheme, snapshot: Snapshot
    ) -> SyncResult:
        """No await in here: the map and the queue change together (the loop's one turn)."""
        keys = self.keys_of(policy.cache_map, replica, scheme)
        held = keys.resync(snapshot.blocks, snapshot.stored)
        policy.cache_map.sync(replica, held)
        self.syncs += 1
        sequence = snapshot.sequence
        stream = self.streams.get(replica)
        if stream is not None and sequence is not None:
            stream.tracker.resync_at(sequence)
            stream.pending = [b for b in stream.pending if b.sequence >= sequence]
        return SyncResult(blocks=len(held))

    # -- views and shutdown --------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        return {
            "applied_events": self.applied,
            "syncs": self.syncs,
            "orphans": sum(self.orphans.values()),
            "replicas": {
                name: {
                    "endpoint": s.endpoint,
                    "replay_endpoint": s.replay_endpoint,
                    "received": s.received,
                    "gaps": s.gaps,
                    "healed_by": dict(s.healed_by),
                    "pending": len(s.pending),
                    "next_sequence": s.tracker.next_expected,
                    "orphans": self.orphans.get(name, 0),
                }
                for name, s in sorted(self.streams.items())
            },
            "streams": {
                name: {"state": str(state), "advice": STATE_ADVICE[state]}
                for name, state in sorted(self.health.states.items())
            },
            "last_sync": {n: r.__dict__ for n, r in sorted(self.last_sync.items())},
        }

    async def close(self) -> None:
        tasks: list[asyncio.Task[object]] = [
            t for s in self.streams.values() if (t := s.reader) is not None
        ]
        tasks += list(self._heals.values())
        tasks += list(self._resyncs.values())
        for name in list(self.streams):
            self._unsubscribe(name)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
