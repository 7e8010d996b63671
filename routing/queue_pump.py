"""The regional queue's driver: hands queued requests to targets (SkyLB §3.3).

Requests that found nothing available wait FCFS per model in
``routing.core.pending_queue``; this module delivers each one a placement the
moment a probe, a completion, a failure, a peer report or a topology change frees
a target, and expires those whose deadline passed (503).
"""

from __future__ import annotations

import asyncio
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from routing.core import errors
from routing.core.pending_queue import QueuedRequest
from routing.core.remote import Placement, nothing_available, place
from routing.telemetry import QUEUE_CANCELLED, QUEUE_PLACED, QUEUE_TIMEOUT

if TYPE_CHECKING:
    from routing.runtime import BalancerRuntime


@dataclass(frozen=True, slots=True)
class Waiter:
    """A queued request as the pump sees it: where to deliver the placement, and
    which targets already failed it."""

    future: asyncio.Future[Placement]
    tried: frozenset[str]
    tried_peers: frozenset[str]


class QueuePump:
    """Hands queued requests to targets the moment one is available (SkyLB §3.3).

    Probes, completions, failures, peer reports and topology changes call
    ``wake`` (the routers' ``on_change``); wake-ups are coalesced into one
    ``call_soon`` and the drain is synchronous, so no await separates seeing a
    target available from taking its lease.  One timer, set for the earliest
    deadline, expires waiting requests (503); nothing polls.
    """

    def __init__(self, runtime: BalancerRuntime) -> None:
        self.rt = runtime
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def wake(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.rt.loop.call_soon(self._drain_all)

    def queued(self) -> None:
        """A request was queued: try to place it, and make sure its deadline is timed."""
        self.wake()
        self._arm()

    def _drain_all(self) -> None:
        self._scheduled = False
        rt = self.rt
        for model, queue in rt.queues.items():
            if not queue:
                continue
            exhausted = functools.partial(nothing_available, model, rt.router, rt.remote)
            placed = queue.drain(self._place, exhausted)
            now = rt.loop.time()
            for entry, placement in placed:
                entry.payload.future.set_result(placement)
                rt.metrics.queue_wait.observe(entry.waited(now), model, QUEUE_PLACED)
            if queue:
                rt.prober.probe_soon(rt.router.reprobe_candidates(model, rt.config.probe_min_gap_s))
        self._arm()

    def _place(self, entry: QueuedRequest[Waiter]) -> Placement | None:
        waiter = entry.payload
        if waiter.future.done():
            return None  # its client left; its own task takes the entry out
        return place(
            entry.request,
            self.rt.router,
            self.rt.remote,
            tried=waiter.tried,
            tried_peers=waiter.tried_peers,
        )

    def _arm(self) -> None:
        deadline = self.rt.queues.next_deadline()
        if deadline is None or deadline >= self._timer_at:
            return  # the timer already set fires first and re-arms
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self.rt.loop.call_at(deadline, self._expire), deadline

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        # A millisecond of slack: the loop may fire a timer a hair before its time.
        now = self.rt.loop.time() + 0.001
        retry = self.rt.config.retry_after_s
        for entry in self.rt.queues.expire(now):
            model, waited, future = entry.request.model, entry.waited(now), entry.payload.future
            if future.done():
                self.rt.metrics.queue_wait.observe(waited, model, QUEUE_CANCELLED)
                continue
            future.set_exception(errors.queue_timeout(model, waited, retry))
            self.rt.metrics.queue_wait.observe(waited, model, QUEUE_TIMEOUT)
        self._arm()
