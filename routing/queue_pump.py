"""The dispatch core's regional queue on the balancer's event loop (SkyLB §3.3).

Requests that found nothing available wait FCFS in ``core.dispatch``;
what to do with them is the core's decision, *when* to ask is this module's:

* wake-ups (the routers' ``on_change``: a probe, a completion, a failure, a
  peer report, a topology change) coalesce into one ``call_soon`` drain, none
  while nothing is queued, and
  the drain is synchronous, so no await separates seeing a target available
  from taking its lease; its placements go to the waiting requests' futures
  and the replicas it names are probed early (``ReplicaProber.probe_soon``);
* one ``call_at`` timer, set for the earliest deadline (``DispatchCore.timer``),
  hands out the core's queue timeouts (503); nothing polls.

Every wait ends in the queue-wait histogram as ``placed``, ``timeout`` or
``cancelled`` (the client went away).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from core.dispatch import DispatchCore, Refuse, Send, Ticket
from routing.telemetry import QUEUE_CANCELLED, QUEUE_PLACED, QUEUE_TIMEOUT, BalancerMetrics

# A millisecond of slack: the loop may fire a timer a hair before its time.
_TIMER_SLACK_S = 0.001


class Waiter:
    """A request's handle in the core: where its decision goes while it waits."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        # A fresh future for each wait (a retry may wait a second time).
        self.future: asyncio.Future[Send[Waiter] | Refuse[Waiter]] | None = None


def alive(ticket: Ticket[Waiter]) -> bool:
    """False once the waiting client left (its future was cancelled or answered)."""
    future = ticket.handle.future
    return future is None or not future.done()


class QueuePump:
    def __init__(
        self,
        core: DispatchCore[Waiter],
        loop: asyncio.AbstractEventLoop,
        metrics: BalancerMetrics,
        *,
        probe_soon: Callable[[Iterable[str]], None],
    ) -> None:
        self.core = core
        self.loop = loop
        self.metrics = metrics
        self.probe_soon = probe_soon
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None

    def wake(self) -> None:
        # Every completion wakes the pump; with nothing queued a drain decides nothing
        # (no sends, no probes, no deadline), so none is scheduled.  A request that
        # queues later wakes it itself (``wait``).
        if not self._scheduled and self.core.queues.total():
            self._scheduled = True
            self.loop.call_soon(self._drain)

    async def wait(self, ticket: Ticket[Waiter]) -> Send[Waiter] | Refuse[Waiter]:
        """The core queued ``ticket``: its placement, or its refusal at the deadline."""
        future: asyncio.Future[Send[Waiter] | Refuse[Waiter]] = self.loop.create_future()
        ticket.handle.future = future
        self.wake()
        self._arm()
        try:
            return await future
        except asyncio.CancelledError:
            # The client left while queued, or in the instant after being placed.
            waited = self.core.cancel(ticket, self.loop.time())
            if waited is not None:
                self.metrics.queue_wait.observe(waited, ticket.request.model, QUEUE_CANCELLED)
            raise

    def _drain(self) -> None:
        self._scheduled = False
        drained = self.core.drain(self.loop.time())
        for send in drained.sends:
            future = send.ticket.handle.future
            assert future is not None  # set by wait() before any drain could run
            future.set_result(send)
            waited = send.waited or 0.0
            self.metrics.queue_wait.observe(waited, send.ticket.request.model, QUEUE_PLACED)
        if drained.probe:
            self.probe_soon(drained.probe)
        self._arm()

    def _arm(self) -> None:
        deadline = self.core.timer()
        if deadline is None:
            return  # the timer already set fires first and re-arms
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        for refusal in self.core.expire(self.loop.time() + _TIMER_SLACK_S):
            future, model = refusal.ticket.handle.future, refusal.ticket.request.model
            waited = refusal.waited or 0.0
            if future is None or future.done():
                self.metrics.queue_wait.observe(waited, model, QUEUE_CANCELLED)
                continue
            future.set_result(refusal)
            self.metrics.queue_wait.observe(waited, model, QUEUE_TIMEOUT)
        self._arm()
