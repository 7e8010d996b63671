"""Where each request goes and when, as events in and decisions out (sans-IO).

``DispatchCore`` is the whole of the balancer's request-path logic: SkyLB's
Algorithm 1 (HANDLEREQUEST, §3.1: a local replica when one is available, else
an available peer, unless the request was forwarded here) behind the regional
FCFS queue of selective pushing (§3.3), retries on another target, and queue
deadlines.  It does no I/O and reads no clock: every event carries ``now`` and
returns decisions, which the driver carries out.  h11 is the model: a protocol
state machine that any transport drives.  Two drivers do:
``routing.dispatch``/``routing.queue_pump`` on the balancer's asyncio loop and
``sim.des.balancer`` in virtual time, so the simulator measures this code, not
a copy of it.

Events and the decisions they return:

* ``arrive``: a request came in.  FCFS: a newcomer is placed at once only when
  its model's queue is empty (it may not overtake requests already waiting), or
  when the engines would serve it ahead of them anyway (they order their queues
  by cached prefix and one caches enough of it: ``CostModel.served_ahead``);
  otherwise, or when nothing is available, it waits (``Wait``) if something
  healthy could take it later (``worth_waiting``), else it is refused (503 no
  healthy replica), and a full queue refuses it (429 queue full).
* ``failed``: an attempt failed before its first byte reached the client.  The
  lease goes back; a replica that broke (not one that said 429, busy) is
  marked unhealthy at once and its circuit breaker opens (a hold-down, then
  trial probes readmit it: ``core.breaker``); the next attempt
  excludes every target already tried, may overtake the queue (the request
  arrived before everything waiting) and queues at the front when it must
  wait, up to ``max_attempts``.  A retry placed at once waits a jittered
  backoff first (``Send.delay_s``, ``core.backoff``).  Then, or when
  waiting is pointless, it is refused: 502 after a broken target, else 429
  while something is merely busy, else 503.
* ``first_token``: the attempt's first token came back; its time since the
  send goes to a policy that learns rates from it (``CostModel``).
* ``finished``: the response ended (or a target's answer was relayed as it is):
  the lease goes back; with the end time and output length, the replica's
  inter-token latency goes to such a policy too, and the engine's completion
  tokens, when the driver has them, train the length predictor.
* ``cancel``: the client left.  Out of the queue, or the placement a drain
  delivered in the instant before it left goes back.
* ``drain``: something may have become available (a probe, a completion, a
  peer report, a topology change: the routers' ``on_change``).  Waiting
  requests are offered targets in FCFS order and stop as soon as nothing is
  available (``nothing_available``); a request whose client is gone is
  skipped.  For a cost-model policy, once the oldest request has waited past
  its admission patience (``CostModel.waives_admission``), the whole queue is
  offered: a held-back replica takes what waited that long.  Behind engines
  that order their queues by cached prefix the whole queue is offered too,
  and while nothing is available only what they would serve ahead is priced.
  For queues left non-empty, the SP-P replicas held back only by an old probe
  are named for an early re-probe.
* ``expire``: the timer the driver armed fired; requests past their deadline
  are refused (503 queue timeout).  ``timer`` says when to arm it: only when
  the earliest deadline is earlier than the one already armed.

The routers' ``on_change`` reaches the *driver*, which schedules one coalesced
``drain``: scheduling is I/O, what the drain decides is this module's.  Probe
results, peer reports and topology changes go to ``LocalRouter`` and
``RemoteRouter`` directly.

Each request's output length is predicted on arrival and each local
replica's KV look-ahead map follows what is sent to it and what completes
(``core.load_forecast``, PreServe §4.2-4.3.1): the core tells the
forecast at the same events where it takes and gives back leases.

Every ``Send`` holds a lease taken when it was decided; exactly one of
``failed``, ``finished`` or ``cancel`` gives it back (``Lease.release`` is
idempotent, so a driver's ``finally`` may release it too).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Generic, TypeAlias, TypeVar

from core import errors
from core.backoff import RetryBackoff
from core.load_anticipator import Outcome
from core.load_forecast import LoadForecast
from core.pending_queue import (
    QueuedRequest,
    QueueFullError,
    RegionalQueues,
)
from core.policy import CostModel
from core.remote import Placement, RemoteRouter, nothing_available, place, worth_waiting
from core.router import LocalRouter
from core.types import RequestDescriptor

P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class Failure:
    """An attempt that failed before its first byte: the request may go elsewhere.

    ``capacity``: the target said it is busy (429); try another without
    marking it unhealthy."""

    reason: str
    status: int | None = None
    capacity: bool = False

    @property
    def marks_unhealthy(self) -> bool:
        return not self.capacity


@dataclass(eq=False, slots=True)
class Ticket(Generic[P]):
    """One request on its way through the core; ``handle`` is the driver's own
    (an asyncio future holder, a simulated call)."""

    request: RequestDescriptor
    handle: P
    tried: set[str] = field(default_factory=set)
    tried_peers: set[str] = field(default_factory=set)
    attempts: int = 0
    last: Failure | None = None
    entry: QueuedRequest[Ticket[P]] | None = None
    placement: Placement | None = None
    # When the current attempt was sent and its first token seen (cost-model timings).
    sent_at: float | None = None
    first_at: float | None = None


@dataclass(frozen=True, slots=True)
class Send(Generic[P]):
    """Send the request to ``placement`` (its lease already taken).

    ``retry``: not the first attempt.  ``waited``: seconds in the queue, when
    a drain placed it.  ``delay_s``: wait this long before sending (a retry's
    jittered backoff; the lease is held meanwhile, so the slot stays this
    request's)."""

    ticket: Ticket[P]
    placement: Placement
    retry: bool = False
    waited: float | None = None
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Wait(Generic[P]):
    """The request is queued; a later ``drain`` or ``expire`` decides it."""

    ticket: Ticket[P]


@dataclass(frozen=True, slots=True)
class Refuse(Generic[P]):
    """Answer the client with ``error``; ``waited`` is set when it left the queue."""

    ticket: Ticket[P]
    error: errors.ApiError
    waited: float | None = None


Decision: TypeAlias = Send[P] | Wait[P] | Refuse[P]


@dataclass(frozen=True, slots=True)
class Drained(Generic[P]):
    """A drain's decisions: queued requests to send, replicas to probe early."""

    sends: list[Send[P]]
    probe: list[str]


def _always(ticket: Ticket[P]) -> bool:
    return True


def _never() -> bool:
    return False


# Prefix lookups one drain spends on finding what the engines would serve ahead
# (one radix-tree walk each): a drain stays cheap behind a long queue, as SGLang's
# scheduler orders only its first 128 waiting requests by prefix.
SERVED_AHEAD_LOOKUPS = 128


@dataclass(slots=True)
class _DueEntries(Generic[P]):
    """Which queued entries a held-back replica may take in one drain: those past
    their admission patience, and, behind engines that order their queues by cached
    prefix, those they would serve ahead (at most ``lookups`` looked up)."""

    cost_model: CostModel
    now: float
    lookups: int = SERVED_AHEAD_LOOKUPS

    def overdue(self, entry: QueuedRequest[Ticket[P]]) -> bool:
        return self.cost_model.waives_admission(entry.waited(self.now))

    def served_ahead(self, entry: QueuedRequest[Ticket[P]]) -> bool:
        if self.lookups <= 0 or not self.cost_model.engines_reorder:
            return False
        self.lookups -= 1
        return self.cost_model.served_ahead(entry.payload.request)


class DispatchCore(Generic[P]):
    def __init__(
        self,
        local: LocalRouter,
        remote: RemoteRouter,
        queues: RegionalQueues[Ticket[P]],
        *,
        max_attempts: int,
        retry_after_s: int,
        probe_min_gap_s: float,
        alive: Callable[[Ticket[P]], bool] = _always,
        forecast: LoadForecast | None = None,
        backoff: RetryBackoff | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.local = local
        self.remote = remote
        self.queues = queues
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.probe_min_gap_s = probe_min_gap_s
        # False once the ticket's client is gone: a drain must not place it.
        self.alive = alive
        self.forecast = forecast or LoadForecast()
        self.backoff = backoff or RetryBackoff()
        self._armed = math.inf

    # -- events -------------------------------------------------------------------------

    def arrive(self, ticket: Ticket[P], now: float) -> Decision[P]:
        ticket.request = self.forecast.predict(ticket.request)
        # FCFS: a newcomer may not overtake requests already waiting (a retry may),
        # unless the engines would serve it ahead of them anyway.
        queued = len(self.queues.for_model(ticket.request.model))
        if not queued or self._served_ahead(ticket.request):
            placement = self._place(ticket, queued_ahead=queued)
            if placement is not None:
                return self._send(ticket, placement, now)
        return self._wait(ticket, now, front=False)

    def failed(self, ticket: Ticket[P], failure: Failure, now: float) -> Decision[P]:
        placement, ticket.placement = ticket.placement, None
        if placement is not None:
            if placement.peer is None and failure.marks_unhealthy:
                self.local.mark_failed(placement.label)
            self._leave_map(ticket, placement)
            placement.lease.release(ok=False)
        ticket.last = failure
        if ticket.attempts >= self.max_attempts:
            return self._refuse(ticket, self._refusal(ticket))
        retried = self._place(ticket)
        if retried is not None:
            send = self._send(ticket, retried, now)
            # ``attempts`` counts the one just placed: the first retry is attempt 2.
            return replace(send, delay_s=self.backoff.delay(ticket.attempts - 1))
        # It arrived before everything now waiting: back in at the front.
        return self._wait(ticket, now, front=True)

    def first_token(self, ticket: Ticket[P], now: float) -> None:
        """The attempt's first token reached the balancer at ``now``: a replica's
        time to first token, for a policy that learns rates from it."""
        placement = ticket.placement
        if placement is None or ticket.sent_at is None or ticket.first_at is not None:
            return
        ticket.first_at = now
        if placement.peer is None:
            self.local.observe_first_token(ticket.request, placement.label, now - ticket.sent_at)

    def finished(
        self,
        ticket: Ticket[P],
        *,
        ok: bool,
        failure: Failure | None = None,
        now: float | None = None,
        output_tokens: int | None = None,
        decode_seconds: float | None = None,
    ) -> Outcome | None:
        """The attempt is over; ``failure`` when the target broke after its first
        byte (too late to retry, but a broken replica is still marked).
        ``output_tokens`` (the engine's usage) at ``now`` gives a learning policy the
        replica's inter-token latency and completes the request in the load forecast;
        ``decode_seconds`` (first token to last) when known.  Returns the request's
        prediction against what it did, when it completed."""
        placement, ticket.placement = ticket.placement, None
        if placement is None:
            return None
        outcome = None
        if ok and placement.peer is None and now is not None and output_tokens is not None:
            self._observe_finish(ticket, placement.label, now, output_tokens)
        if failure is not None and placement.peer is None and failure.marks_unhealthy:
            self.local.mark_failed(placement.label)
        if placement.peer is None and ok and output_tokens is not None and now is not None:
            outcome = self.forecast.complete(
                placement.label, ticket.request, output_tokens, now, decode_seconds
            )
        else:
            self._leave_map(ticket, placement)
        self.forecast.forget(ticket.request.request_id)
        placement.lease.release(ok=ok)
        return outcome

    @staticmethod
    def _place_if_due(
        place: Callable[[QueuedRequest[Ticket[P]]], Placement | None],
        exhausted: Callable[[], bool],
        due: _DueEntries[P],
        entry: QueuedRequest[Ticket[P]],
    ) -> Placement | None:
        """``place`` for a due entry, and for any other only while something is
        available, as a drain with nothing due treats every entry: with nothing
        available, asking the policy about a request not yet due would decide the
        whole queue again at every drain (docs/results.md, *An overdue queue asks only
        about what is due*).  The cheap tests first: a prefix lookup only for an entry
        that nothing available could otherwise take."""
        if due.overdue(entry) or not exhausted() or due.served_ahead(entry):
            return place(entry)
        return None

    def _served_ahead(self, request: RequestDescriptor) -> bool:
        cost_model = self.local.cost_model(request.model)
        return cost_model is not None and cost_model.served_ahead(request)

    def _observe_finish(self, ticket: Ticket[P], name: str, now: float, output: int) -> None:
        if ticket.first_at is not None:
            self.local.observe_finish(ticket.request, name, now - ticket.first_at, output)

    def cancel(self, ticket: Ticket[P], now: float) -> float | None:
        """The client left: seconds it waited when it was still queued, else None."""
        entry, ticket.entry = ticket.entry, None
        if entry is not None and self.queues.for_model(ticket.request.model).remove(entry):
            return entry.waited(now)
        placement, ticket.placement = ticket.placement, None
        self.forecast.forget(ticket.request.request_id)
        if placement is not None:
            # Placed by a drain in the instant before the client left.
            self._leave_map(ticket, placement)
            placement.lease.release(ok=False)
        return None

    def drain(self, now: float) -> Drained[P]:
        sends: list[Send[P]] = []
        probe: list[str] = []
        for model, queue in self.queues.items():
            if not queue:
                continue
            exhausted: Callable[[], bool] = functools.partial(
                nothing_available, model, self.local, self.remote
            )
            place_queued = functools.partial(self._place_queued, now=now, queued=len(queue))
            cost_model = self.local.cost_model(model)
            if cost_model is not None and (
                cost_model.engines_reorder or cost_model.waives_admission(queue.oldest_wait(now))
            ):
                # Some entry may go to a held-back replica (the oldest is overdue, or
                # the engines serve a cached prompt ahead), so every entry is looked
                # at; the rest only while something is available, as in any drain.
                due = _DueEntries[P](cost_model, now)
                place_queued = functools.partial(self._place_if_due, place_queued, exhausted, due)
                exhausted = _never
            for entry, placement in queue.drain(place_queued, exhausted):
                entry.payload.entry = None
                sends.append(self._send(entry.payload, placement, now, waited=entry.waited(now)))
            if queue:
                probe += self.local.reprobe_candidates(model, self.probe_min_gap_s)
        return Drained(sends, probe)

    def expire(self, now: float) -> list[Refuse[P]]:
        """The armed timer fired at ``now``: refuse every request past its deadline."""
        if now < self._armed:
            return []  # superseded by an earlier deadline (a timer the driver kept)
        self._armed = math.inf
        refusals = []
        for entry in self.queues.expire(now):
            ticket, waited = entry.payload, entry.waited(now)
            ticket.entry = None
            error = errors.queue_timeout(ticket.request.model, waited, self.retry_after_s)
            self.forecast.forget(ticket.request.request_id)
            refusals.append(Refuse(ticket, error, waited))
        return refusals

    def timer(self) -> float | None:
        """When to arm the deadline timer: the earliest deadline, only when it is
        earlier than the one armed already (that one fires first and re-arms)."""
        deadline = self.queues.next_deadline()
        if deadline is None or deadline >= self._armed:
            return None
        self._armed = deadline
        return deadline

    # -- decisions ------------------------------------------------------------------------

    def _place(
        self, ticket: Ticket[P], waited_s: float = 0.0, queued_ahead: int = 0
    ) -> Placement | None:
        return place(
            ticket.request,
            self.local,
            self.remote,
            tried=ticket.tried,
            tried_peers=ticket.tried_peers,
            waited_s=waited_s,
            queued_ahead=queued_ahead,
        )

    def _place_queued(
        self, entry: QueuedRequest[Ticket[P]], *, now: float, queued: int
    ) -> Placement | None:
        if not self.alive(entry.payload):
            return None  # its client left; the driver's cancel takes the entry out
        # The queue's length bounds how many wait ahead (a cost model prices it).
        return self._place(entry.payload, entry.waited(now), queued - 1)

    def _send(
        self, ticket: Ticket[P], placement: Placement, now: float, waited: float | None = None
    ) -> Send[P]:
        ticket.attempts += 1
        (ticket.tried if placement.peer is None else ticket.tried_peers).add(placement.label)
        ticket.placement = placement
        ticket.sent_at, ticket.first_at = now, None
        if placement.peer is None:
            self.forecast.admit(placement.label, ticket.request, now)
        return Send(ticket, placement, retry=ticket.attempts > 1, waited=waited)

    def _wait(self, ticket: Ticket[P], now: float, *, front: bool) -> Decision[P]:
        request = ticket.request
        if not worth_waiting(request, self.local, self.remote, ticket.tried):
            return self._refuse(ticket, self._refusal(ticket))
        try:
            ticket.entry = self.queues.for_model(request.model).push(
                request, ticket, now, front=front
            )
        except QueueFullError as full:
            error = errors.queue_full(request.model, full.max_len, self.retry_after_s)
            return self._refuse(ticket, error)
        return Wait(ticket)

    def _refuse(self, ticket: Ticket[P], error: errors.ApiError) -> Refuse[P]:
        self.forecast.forget(ticket.request.request_id)
        return Refuse(ticket, error)

    def _leave_map(self, ticket: Ticket[P], placement: Placement) -> None:
        if placement.peer is None:
            self.forecast.abandon(placement.label, ticket.request.request_id)

    def _refusal(self, ticket: Ticket[P]) -> errors.ApiError:
        model, retry, last = ticket.request.model, self.retry_after_s, ticket.last
        if last is not None and not last.capacity:
            attempts = len(ticket.tried) + len(ticket.tried_peers)
            return errors.upstream_failed(model, attempts, last.reason)
        healthy, _ = self.local.counts(model)
        # A peer with healthy replicas counts only if this request may still be forwarded.
        peer_busy = not ticket.request.forwarded and self.remote.has_healthy(model)
        if healthy or (last is not None and last.capacity) or peer_busy:
            return errors.at_capacity(model, retry)
        return errors.no_healthy_replica(model, retry)
