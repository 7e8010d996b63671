"""A discrete-event loop in virtual time: a heap of timed callbacks.

Production runs the routing core on one asyncio loop where nothing happens
between awaits; the simulator keeps that property by running every callback to
completion before the next one.  Ties in time are broken by the order in which
events were scheduled (a sequence number), which is what asyncio's
``call_soon`` does and what makes a run deterministic for a seed: no wall clock,
no hash order, no threads.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class EventLoop:
    """Virtual time ``now`` (seconds) and the callbacks still to run."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events_run = 0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._stopped = False

    def clock(self) -> float:
        """The routing core's ``Clock``: the routers read virtual time through this."""
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> None:
        # Never into the past: a callback scheduled "at now" runs after those already due.
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), callback, args))

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> None:
        self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        self.call_at(self.now, callback, *args)

    def pending(self) -> int:
        return len(self._heap)

    def stop(self) -> None:
        """End ``run`` after the current callback."""
        self._stopped = True

    def run(self, until: float | None = None) -> None:
        """Run callbacks in time order until none is left, ``until`` or ``stop()``."""
        heap, pop = self._heap, heapq.heappop
        self._stopped = False
        while heap and not self._stopped:
            when = heap[0][0]
            if until is not None and when > until:
                self.now = until
                return
            _, _, callback, args = pop(heap)
            self.now = when
            self.events_run += 1
            callback(*args)
