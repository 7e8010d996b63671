"""One regional balancer in virtual time, driving the production routing core.

The decisions are ``routing.core``'s own objects, built the way
``routing.runtime.BalancerRuntime`` builds them: a ``LocalRouter`` and a
``RemoteRouter`` from ``registry.build_policy``/``remote_policy_name``, one
``RegionalQueues``, SkyLB Algorithm 1 through ``remote.place``, queue hand-off
through ``PendingQueue.drain`` with ``nothing_available`` as its stop test.
What this module replaces is only the glue's I/O, in virtual time:

* ``routing.dispatch``: a newcomer places at once only when its model's queue is
  empty (FCFS), else queues; a refusal from a peer retries on another target
  from the queue's front, up to ``max_attempts`` (§3.3);
* ``routing.queue_pump``: wake-ups coalesce into one ``call_soon`` drain, a timer
  at the earliest deadline expires waiting requests (503), and replicas held back
  only by an old probe are probed again early;
* ``routing.prober``: a probe round every ``probe_interval_s`` after the last
  one returned, each probe paying the RTT to its replica (SP-P's view is as old
  as in production), plus ``probe_soon`` with one probe in flight per replica;
* ``routing.peers.AvailabilityPoller``: polls every peer's heartbeat every
  ``availability_interval_s``; a report is built at the peer when the poll
  arrives and recorded one way later (staleness = half an RTT at least).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Protocol

from routing.core.engine_metrics import EngineLoad
from routing.core.leases import Lease
from routing.core.peers import Heartbeat
from routing.core.pending_queue import QueuedRequest, QueueFullError, RegionalQueues
from routing.core.registry import build_policy, remote_policy_name
from routing.core.remote import (
    Placement,
    RemoteRouter,
    availability_report,
    nothing_available,
    place,
    worth_waiting,
)
from routing.core.router import LocalRouter
from routing.core.topology import ModelSpec, PeerSpec, ReplicaSpec
from sim.des.calls import (
    STATUS_BAD_REQUEST,
    STATUS_QUEUE_FULL,
    STATUS_UNAVAILABLE,
    CallResult,
    SimCall,
    refused,
)
from sim.des.config import TimingConfig
from sim.des.loop import EventLoop
from sim.des.replica import Generation, SimReplica
from sim.engine import EngineRequest, RequestOutput


class Network(Protocol):
    """Where things are and how far apart (``sim.des.world.World``)."""

    loop: EventLoop

    def one_way_s(self, a: str, b: str) -> float: ...

    def replica(self, name: str) -> SimReplica: ...

    def balancer(self, name: str) -> SimBalancer: ...


class SimBalancer:
    def __init__(self, name: str, region: str, net: Network, timing: TimingConfig) -> None:
        self.name, self.region, self.net, self.timing = name, region, net, timing
        self.loop = net.loop
        self.router = LocalRouter(
            build_policy,
            max_outstanding=timing.max_outstanding,
            probe_stale_s=timing.probe_stale_s,
            clock=self.loop.clock,
        )
        self.remote = RemoteRouter(
            build_policy,
            remote_policy_name,
            queue_buffer=timing.peer_queue_buffer,
            max_age_s=timing.availability_ttl_s,
            clock=self.loop.clock,
        )
        self.queues: RegionalQueues[SimCall] = RegionalQueues()
        self.router.on_change = self.remote.on_change = self.wake
        self.peers: tuple[PeerSpec, ...] = ()
        self.probes = 0
        self._replica_regions: dict[str, str] = {}
        self._scheduled = False
        self._timer_at = math.inf
        self._probing: set[str] = set()

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

    # -- the request path (routing.dispatch) -------------------------------------------

    def submit(self, call: SimCall, *, retry: bool = False) -> None:
        """A request arrives (or comes back for another attempt after a refusal)."""
        model = call.descriptor.model
        queue = self.queues.for_model(model)
        # FCFS: a newcomer may not overtake requests already waiting (a retry may).
        if retry or not queue:
            placement = self._place_call(call)
            if placement is not None:
                self._start(call, placement)
                return
        if not worth_waiting(call.descriptor, self.router, self.remote, frozenset(call.tried)):
            call.on_done(refused(STATUS_UNAVAILABLE, "no healthy target"))
            return
        try:
            queue.push(call.descriptor, call, self.loop.now, front=retry)
        except QueueFullError as full:
            call.on_done(refused(STATUS_QUEUE_FULL, str(full)))
            return
        self.wake()
        self._arm()

    def _place_call(self, call: SimCall) -> Placement | None:
        return place(
            call.descriptor,
            self.router,
            self.remote,
            tried=frozenset(call.tried),
            tried_peers=frozenset(call.tried_peers),
        )

    def _start(self, call: SimCall, placement: Placement) -> None:
        call.attempts += 1
        if placement.peer is not None:
            call.tried_peers.add(placement.label)
            self._forward(call, placement)
        else:
            call.tried.add(placement.label)
            self._to_replica(call, placement)

    def _to_replica(self, call: SimCall, placement: Placement) -> None:
        name = placement.target.target_id
        one_way = self.net.one_way_s(self.region, self._replica_regions[name])
        generation = Generation(
            on_first=lambda: self.loop.call_later(one_way, call.on_first),
            on_done=lambda out, tokens: self.loop.call_later(
                one_way, self._replica_done, call, placement.lease, name, out, tokens
            ),
        )
        self.loop.call_later(one_way, self._arrive_at_replica, call, placement.lease, generation)

    def _arrive_at_replica(self, call: SimCall, lease: Lease, generation: Generation) -> None:
        request = EngineRequest(
            call.descriptor.request_id, call.prompt_ids, call.max_tokens, ignore_eos=call.ignore_eos
        )
        replica = self.net.replica(lease.target.target_id)
        try:
            replica.submit(request, generation)
        except ValueError as exc:  # the engine's own limits: the API's 400
            lease.release(ok=False)
            call.on_done(refused(STATUS_BAD_REQUEST, str(exc)))
            return
        call.journey.replica, call.journey.served_region = replica.name, replica.region

    def _replica_done(
        self, call: SimCall, lease: Lease, name: str, out: RequestOutput, tokens: list[int]
    ) -> None:
        lease.release(ok=True)
        self.router.record_usage(name, out.prompt_tokens, out.cached_tokens, out.completion_tokens)
        call.on_done(
            CallResult(
                ok=True,
                status=200,
                prompt_tokens=out.prompt_tokens,
                cached_tokens=out.cached_tokens,
                completion_tokens=out.completion_tokens,
                tokens=tuple(tokens),
            )
        )

    def _forward(self, call: SimCall, placement: Placement) -> None:
        assert placement.peer is not None
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
                one_way, self._forward_done, call, placement.lease, result
            ),
        )
        self.loop.call_later(one_way, peer.submit, inner)

    def _forward_done(self, call: SimCall, lease: Lease, result: CallResult) -> None:
        lease.release(ok=result.ok)
        if result.ok or not result.capacity or call.attempts >= self.timing.max_attempts:
            call.on_done(result)
            return
        self.submit(call, retry=True)  # dispatch's next attempt, excluding that peer

    # -- the queue pump (routing.queue_pump) ------------------------------------------

    def wake(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain_all)

    def _drain_all(self) -> None:
        self._scheduled = False
        for model, queue in self.queues.items():
            if not queue:
                continue
            exhausted = functools.partial(nothing_available, model, self.router, self.remote)
            placed = queue.drain(self._place_entry, exhausted)
            now = self.loop.now
            for entry, placement in placed:
                entry.payload.journey.queue_wait += entry.waited(now)
                self._start(entry.payload, placement)
            if queue:
                self.probe_soon(self.router.reprobe_candidates(model, self.timing.probe_min_gap_s))
        self._arm()

    def _place_entry(self, entry: QueuedRequest[SimCall]) -> Placement | None:
        return self._place_call(entry.payload)

    def _arm(self) -> None:
        deadline = self.queues.next_deadline()
        if deadline is None or deadline >= self._timer_at:
            return
        self._timer_at = deadline
        self.loop.call_at(deadline, self._expire, deadline)

    def _expire(self, armed_for: float) -> None:
        if armed_for != self._timer_at:
            return  # superseded by an earlier deadline's timer
        self._timer_at = math.inf
        for entry in self.queues.expire(self.loop.now):
            entry.payload.journey.queue_wait += entry.waited(self.loop.now)
            entry.payload.on_done(refused(STATUS_UNAVAILABLE, "queue_timeout"))
        self._arm()

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
