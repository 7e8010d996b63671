"""One regional balancer in virtual time: the production dispatch core, another driver.

The decisions are ``core``'s own objects, built the way
``routing.runtime.BalancerRuntime`` builds them: a ``LocalRouter`` and a
``RemoteRouter`` from ``registry.build_policy``/``remote_policy_name``, and one
``DispatchCore`` over one ``RegionalQueues``.  Placement (Algorithm 1), FCFS
queue hand-off, retries on another target, queue deadlines and the early
re-probe candidates are that core's, the very code the asyncio balancer runs;
this module has no copy of them.  It keeps the clock and the transport:

* driving the core as ``routing.dispatch``/``routing.queue_pump`` do: arrivals
  go to ``arrive``; wake-ups (the routers' ``on_change``) coalesce into one
  ``call_soon`` drain; one timer, armed when ``DispatchCore.timer`` says,
  calls ``expire``;
* the transport, in virtual time: a replica is a ``SimReplica`` one way away;
  a forward is a call into the peer's ``SimBalancer`` whose answer comes back
  one way later, a 429 or 5xx being a failure before the first byte (the
  core's ``failed``), anything else relayed as it is, as ``routing.upstream``
  reads an answer;
* ``routing.prober``: a probe round every ``probe_interval_s`` after the last
  one returned, each probe paying the RTT to its replica (SP-P's view is as old
  as in production), plus ``probe_soon`` with one probe in flight per replica;
* ``routing.peers.AvailabilityPoller``: polls every peer's heartbeat every
  ``availability_interval_s``; a report is built at the peer when the poll
  arrives and recorded one way later (staleness = half an RTT at least);
* ``routing.kv_events``, for a ``cache_map`` service or a ``meridian`` one whose
  tree follows the engines (``tree_from_kv_events``): each replica's KV events
  (published after every engine step) arrive one way later, wait in the queue
  for the next ``kv_events_batch_s`` tick and are applied to the policy's cache
  map (or tree) by ``core.event_keys.apply_events``, keyed as a ``token_ids``
  balancer keys them (``RebuiltKeys``, Meridian's own chain): the cache map
  follows the engines as in production, instead of living on speculation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from core.backoff import RetryBackoff
from core.blocks import DEFAULT_SEED
from core.breaker import BreakerConfig
from core.dispatch import Decision, DispatchCore, Failure, Refuse, Send, Ticket, Wait
from core.engine_metrics import EngineLoad
from core.event_keys import RebuiltKeys, apply_events
from core.kv_events import CacheEvent
from core.load_forecast import LoadForecast
from core.peers import Heartbeat
from core.pending_queue import RegionalQueues
from core.policies.cache_map import CacheMapPolicy
from core.policy import Policy
from core.registry import build_policy, remote_policy_name
from core.remote import Placement, RemoteRouter, availability_report
from core.router import LocalRouter
from core.topology import ModelSpec, PeerSpec, ReplicaSpec
from sim.des.calls import STATUS_BAD_REQUEST, CallResult, SimCall, refused
from sim.des.config import TimingConfig
from sim.des.loop import EventLoop
from sim.des.replica import Generation
from sim.engine import EngineRequest, RequestOutput


class Replica(Protocol):
    """What the transport needs of a replica (``sim.des.replica.SimReplica``)."""

    name: str
    region: str

    def load(self) -> EngineLoad: ...

    def submit(self, request: EngineRequest, generation: Generation) -> None: ...


class Peer(Protocol):
    """What the transport needs of a peer balancer (another ``SimBalancer``)."""

    region: str

    def submit(self, call: SimCall) -> None: ...

    def heartbeat(self) -> Heartbeat: ...


class Network(Protocol):
    """Where things are and how far apart (``sim.des.world.World``)."""

    loop: EventLoop

    def one_way_s(self, a: str, b: str) -> float: ...

    def replica(self, name: str) -> Replica: ...

    def balancer(self, name: str) -> Peer: ...


def _failed_before_first_byte(status: int) -> bool:
    """An answer ``routing.upstream.open_upstream`` turns into a retryable failure."""
    return status == 429 or status >= 500


class SimBalancer:
    def __init__(
        self,
        name: str,
        region: str,
        net: Network,
        timing: TimingConfig,
        forecast: LoadForecast | None = None,
    ) -> None:
        self.name, self.region, self.net, self.timing = name, region, net, timing
        self.loop = net.loop
        self.router = LocalRouter(
            self._build_policy,
            max_outstanding=timing.max_outstanding,
            probe_stale_s=timing.probe_stale_s,
            breaker=BreakerConfig(
                timing.breaker_hold_down_s,
                timing.breaker_max_hold_down_s,
                timing.breaker_readmit_probes,
            ),
            clock=self.loop.clock,
        )
        self.remote = RemoteRouter(
            build_policy,
            remote_policy_name,
            queue_buffer=timing.peer_queue_buffer,
            max_age_s=timing.availability_ttl_s,
            clock=self.loop.clock,
        )
        self.queues: RegionalQueues[Ticket[SimCall]] = RegionalQueues()
        self.core: DispatchCore[SimCall] = DispatchCore(
            self.router,
            self.remote,
            self.queues,
            max_attempts=timing.max_attempts,
            retry_after_s=timing.retry_after_s,
            probe_min_gap_s=timing.probe_min_gap_s,
            forecast=forecast,
            backoff=RetryBackoff(timing.retry_backoff_s, timing.retry_backoff_max_s),
        )
        self.router.on_change = self.remote.on_change = self.wake
        self.peers: tuple[PeerSpec, ...] = ()
        self.probes = 0
        self._replica_regions: dict[str, str] = {}
        self._scheduled = False
        self._probing: set[str] = set()
        self._kv_keys: dict[str, RebuiltKeys] = {}
        self.kv_events_applied = 0

    def _build_policy(self, name: str, params: Mapping[str, Any] | None = None) -> Policy:
        """``registry.build_policy``, with a cache map's clock on virtual time: its
        speculative entries must expire after ``speculative_ttl_s`` *simulated* seconds."""
        policy = build_policy(name, params)
        if isinstance(policy, CacheMapPolicy):
            return CacheMapPolicy(policy.config, clock=self.loop.clock)
        return policy

    # -- topology and background loops -----------------------------------------------

    def adopt(
        self,
        replicas: list[ReplicaSpec],
        peers: list[PeerSpec],
        models: Mapping[str, ModelSpec],
    ) -> None:
        """As ``BalancerRuntime.adopt``: both layers and the queue bounds."""
        self.router.apply(replicas, models)
        self.remote.apply(peers, models)
        self.queues.configure({m: (s.queue_max_len, s.queue_max_wait_s) for m, s in models.items()})
        self.peers = tuple(peers)
        self._replica_regions = {spec.name: spec.region for spec in replicas}

    def start(self) -> None:
        """First probe round and peer poll at once, as the runtime's first start."""
        self.loop.call_soon(self._probe_round)
        if self.peers:
            self.loop.call_soon(self._poll_round)

    def heartbeat(self) -> Heartbeat:
        """The availability report (Algorithm 1, lines 9-10), as ``runtime.heartbeat``."""
        return availability_report(
            balancer=self.name,
            region=self.region,
            url=f"sim://{self.name}",
            ts=self.loop.now,
            local=self.router,
            remote=self.remote,
            queue_lengths=self.queues.lengths(),
        )

    # -- driving the dispatch core (routing.dispatch, routing.queue_pump) ---------------

    def submit(self, call: SimCall) -> None:
        """A request arrives."""
        self._carry_out(self.core.arrive(Ticket(call.descriptor, call), self.loop.now))

    def _carry_out(self, decision: Decision[SimCall]) -> None:
        if isinstance(decision, Send):
            self._send(decision)
        elif isinstance(decision, Wait):
            self.wake()
            self._arm()
        else:
            self._refuse(decision)

    def wake(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        drained = self.core.drain(self.loop.now)
        for send in drained.sends:
            send.ticket.handle.journey.queue_wait += send.waited or 0.0
            self._send(send)
        self.probe_soon(drained.probe)
        self._arm()

    def _arm(self) -> None:
        deadline = self.core.timer()
        if deadline is not None:
            # No cancelling in virtual time: a superseded timer fires and the core ignores it.
            self.loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        for refusal in self.core.expire(self.loop.now):
            self._refuse(refusal)
        self._arm()

    def _refuse(self, refusal: Refuse[SimCall]) -> None:
        call, error = refusal.ticket.handle, refusal.error
        call.journey.queue_wait += refusal.waited or 0.0
        call.on_done(refused(error.status, error.code or error.message))

    # -- the transport: replicas and peers one way away ---------------------------------

    def _send(self, send: Send[SimCall]) -> None:
        if send.delay_s > 0:
            # A retry's jittered backoff, as the asyncio driver sleeps it.
            self.loop.call_later(send.delay_s, self._send, dataclasses.replace(send, delay_s=0.0))
            return
        if send.placement.peer is not None:
            self._forward(send.ticket, send.placement)
        else:
            self._to_replica(send.ticket, send.placement)

    def _to_replica(self, ticket: Ticket[SimCall], placement: Placement) -> None:
        name = placement.label
        one_way = self.net.one_way_s(self.region, self._replica_regions[name])
        first_at: list[float] = []  # when the first token left the replica

        def on_first() -> None:
            first_at.append(self.loop.now)
            self.loop.call_later(one_way, self._first_token, ticket)

        def on_done(out: RequestOutput, tokens: list[int]) -> None:
            ticket.handle.journey.engine_started_at = generation.scheduled_at
            self.loop.call_later(one_way, self._replica_done, ticket, name, out, tokens, first_at)

        generation = Generation(on_first=on_first, on_done=on_done)
        priority = placement.priority or 0
        self.loop.call_later(one_way, self._arrive_at_replica, ticket, name, generation, priority)

    def _arrive_at_replica(
        self, ticket: Ticket[SimCall], name: str, generation: Generation, priority: int
    ) -> None:
        call = ticket.handle
        request = EngineRequest(
            call.descriptor.request_id, call.prompt_ids, call.max_tokens,
            ignore_eos=call.ignore_eos, priority=priority,
        )  # fmt: skip
        replica = self.net.replica(name)
        try:
            replica.submit(request, generation)
        except ValueError as exc:  # the engine's own limits: the API's 400, relayed
            self.core.finished(ticket, ok=False)
            call.on_done(refused(STATUS_BAD_REQUEST, str(exc)))
            return
        call.journey.replica, call.journey.served_region = replica.name, replica.region

    def _first_token(self, ticket: Ticket[SimCall]) -> None:
        self.core.first_token(ticket, self.loop.now)
        ticket.handle.on_first()

    def _replica_done(
        self,
        ticket: Ticket[SimCall],
        name: str,
        out: RequestOutput,
        tokens: list[int],
        first_at: list[float],
    ) -> None:
        # As routing.dispatch settles: usage trains the predictor, the first token to
        # the last (one way later at both ends) teaches the replica's iteration time.
        decode_s = self.loop.now - first_at[0] if first_at else None
        self.core.finished(
            ticket,
            ok=True,
            now=self.loop.now,
            output_tokens=out.completion_tokens,
            decode_seconds=decode_s,
        )
        self.router.record_usage(name, out.prompt_tokens, out.cached_tokens, out.completion_tokens)
        ticket.handle.on_done(
            CallResult(
                ok=True,
                status=200,
                prompt_tokens=out.prompt_tokens,
                cached_tokens=out.cached_tokens,
                completion_tokens=out.completion_tokens,
                tokens=tuple(tokens),
            )
        )

    def _forward(self, ticket: Ticket[SimCall], placement: Placement) -> None:
        call = ticket.handle
        peer = self.net.balancer(placement.label)
        one_way = self.net.one_way_s(self.region, peer.region)
        call.journey.forwarded = True
        inner = SimCall(
            dataclasses.replace(call.descriptor, forwarded=True),
            call.prompt_ids,
            call.max_tokens,
            call.ignore_eos,
            call.journey,
            on_first=lambda: self.loop.call_later(one_way, call.on_first),
            on_done=lambda result: self.loop.call_later(
                one_way, self._forward_done, ticket, result
            ),
        )
        self.loop.call_later(one_way, peer.submit, inner)

    def _forward_done(self, ticket: Ticket[SimCall], result: CallResult) -> None:
        if result.ok or not _failed_before_first_byte(result.status):
            self.core.finished(ticket, ok=result.ok)
            ticket.handle.on_done(result)
            return
        # The peer refused before its first byte: the core tries another target.
        failure = Failure(result.error, result.status, capacity=result.status == 429)
        self._carry_out(self.core.failed(ticket, failure, self.loop.now))

    # -- KV events (routing.kv_events) -------------------------------------------------

    def kv_events_arrive(self, replica: str, model: str, events: tuple[CacheEvent, ...]) -> None:
        """A replica's step published ``events``: they travel one way, then wait for
        the consumer's next batch tick (``MERIDIAN_KV_EVENTS_BATCH_S``)."""
        one_way = self.net.one_way_s(self._replica_regions[replica], self.region)
        tick = self.timing.kv_events_batch_s
        arrives = self.loop.now + one_way
        applied_at = math.ceil(arrives / tick) * tick
        self.loop.call_at(applied_at, self._apply_kv_events, replica, model, events)

    def _apply_kv_events(self, replica: str, model: str, events: tuple[CacheEvent, ...]) -> None:
        sink = self.router.kv_sink(model)
        if sink is None:
            return
        keys = self._kv_keys.setdefault(replica, RebuiltKeys(DEFAULT_SEED))
        self.kv_events_applied += apply_events(sink, replica, events, keys).events

    # -- probes (routing.prober) and peer polls (routing.peers) ----------------------

    def _probe_round(self) -> None:
        names = [t.target_id for t in self.router.targets()]
        slowest = 0.0
        for name in names:
            one_way = self.net.one_way_s(self.region, self._replica_regions[name])
            slowest = max(slowest, 2 * one_way + self.timing.probe_rtt_s)
            self._send_probe(name, one_way)
        # routing.runtime._spawn: sleep the period after each round has returned.
        self.loop.call_later(slowest + self.timing.probe_interval_s, self._probe_round)

    def probe_soon(self, names: list[str]) -> None:
        for name in names:
            if name in self._probing:
                continue
            self._probing.add(name)
            one_way = self.net.one_way_s(self.region, self._replica_regions[name])
            self._send_probe(name, one_way, self._probing.discard)

    def _send_probe(
        self, name: str, one_way: float, done: Callable[[str], None] | None = None
    ) -> None:
        self.probes += 1
        self.loop.call_later(one_way, self._probe_arrives, name, one_way, done)

    def _probe_arrives(self, name: str, one_way: float, done: Callable[[str], None] | None) -> None:
        load = self.net.replica(name).load()
        self.loop.call_later(
            one_way + self.timing.probe_rtt_s, self._probe_returns, name, load, done
        )

    def _probe_returns(
        self, name: str, load: EngineLoad, done: Callable[[str], None] | None
    ) -> None:
        if done is not None:
            done(name)
        self.router.record_probe(name, load)

    def _poll_round(self) -> None:
        slowest = 0.0
        for spec in self.peers:
            one_way = self.net.one_way_s(self.region, spec.region)
            slowest = max(slowest, 2 * one_way)
            self.loop.call_later(one_way, self._poll_arrives, spec.name, one_way)
        self.loop.call_later(slowest + self.timing.availability_interval_s, self._poll_round)

    def _poll_arrives(self, peer: str, one_way: float) -> None:
        report = self.net.balancer(peer).heartbeat()
        self.loop.call_later(one_way, self.remote.record_report, peer, report)
