"""The balancer's FCFS queue of requests waiting for an available target (SkyLB §3.3).

Selective pushing keeps requests in the balancer until a target is available
instead of piling them onto replicas' own queues, so a request that waits
here can still go to whichever replica (or peer region, §3.1) frees up first.

One ``PendingQueue`` per model, bounded twice (ServiceConfig's
``queue_max_len`` and ``queue_max_wait_s``):

* a push beyond ``max_len`` raises ``QueueFullError`` (the client gets 429);
* ``expire(now)`` removes and returns every entry past its deadline (503).

Entries carry an opaque ``payload`` (the dispatch core's ticket) so this module
knows nothing about requests in flight.  Removal is O(1) (a dict keeps
insertion order), which matters because a client that disconnects while queued
removes its own entry.  The earliest deadline and the oldest arrival are read at
every drain and timer, so each has a heap beside the dict (an entry that left is
skipped when it surfaces, and the heaps are rebuilt once they hold twice the
live entries): a scan of the whole queue there cost 31 and 140 µs per call with
1,000 requests waiting (docs/performance.md), as much again as a request's whole path through the
balancer, at the moment it is overloaded.
A retry after a failed attempt goes back to the front: it arrived before
everything now waiting.

``drain`` is the one place entries leave for a target: it walks the queue in
order and lets a ``place`` callback decide each entry; the callback must not
await (the queue is mutated while it runs), which is what makes the whole
hand-off atomic on the balancer's single event loop.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from core.types import RequestDescriptor

P = TypeVar("P")
R = TypeVar("R")


class QueueFullError(Exception):
    def __init__(self, model: str, max_len: int) -> None:
        super().__init__(f"queue for {model} holds {max_len} requests already")
        self.model = model
        self.max_len = max_len


@dataclass(eq=False, slots=True)
class QueuedRequest(Generic[P]):
    request: RequestDescriptor
    payload: P
    enqueued_at: float
    deadline: float
    seq: int = field(default=0)

    def waited(self, now: float) -> float:
        return max(0.0, now - self.enqueued_at)


class PendingQueue(Generic[P]):
    def __init__(self, model: str, *, max_len: int, max_wait_s: float) -> None:
        if max_len < 0 or max_wait_s < 0:
            raise ValueError("queue bounds must not be negative")
        self.model = model
        self.max_len = max_len
        self.max_wait_s = max_wait_s
        self._entries: dict[int, QueuedRequest[P]] = {}
        self._seq = itertools.count()
        # (deadline, seq) and (enqueued_at, seq) of every entry pushed, the ones
        # that left included until they surface (``_live_top``).
        self._by_deadline: list[tuple[float, int]] = []
        self._by_arrival: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[QueuedRequest[P]]:
        """Entries in FCFS order (a snapshot: safe to remove while iterating)."""
        return iter(list(self._entries.values()))

    def __contains__(self, entry: object) -> bool:
        return isinstance(entry, QueuedRequest) and self._entries.get(entry.seq) is entry

    def push(
        self,
        request: RequestDescriptor,
        payload: P,
        now: float,
        *,
        front: bool = False,
        deadline: float | None = None,
    ) -> QueuedRequest[P]:
        """Queue ``request`` (at the back, or at the front for a retry)."""
        if len(self._entries) >= self.max_len:
            raise QueueFullError(self.model, self.max_len)
        entry = QueuedRequest(
            request,
            payload,
            enqueued_at=now,
            deadline=now + self.max_wait_s if deadline is None else deadline,
            seq=next(self._seq),
        )
        if front:
            self._entries = {entry.seq: entry, **self._entries}
        else:
            self._entries[entry.seq] = entry
        heapq.heappush(self._by_deadline, (entry.deadline, entry.seq))
        heapq.heappush(self._by_arrival, (entry.enqueued_at, entry.seq))
        if len(self._by_deadline) > 2 * len(self._entries) + 64:
            self._rebuild_heaps()
        return entry

    def remove(self, entry: QueuedRequest[P]) -> bool:
        """Take ``entry`` out (cancelled, timed out, placed); False if already gone."""
        if entry not in self:
            return False
        del self._entries[entry.seq]
        return True

    def expire(self, now: float) -> list[QueuedRequest[P]]:
        """Remove and return every entry whose deadline has passed, earliest first."""
        gone: list[QueuedRequest[P]] = []
        while (top := self._live_top(self._by_deadline)) is not None and top[0] <= now:
            heapq.heappop(self._by_deadline)
            gone.append(self._entries.pop(top[1]))
        return gone

    def next_deadline(self) -> float | None:
        top = self._live_top(self._by_deadline)
        return None if top is None else top[0]

    def oldest_wait(self, now: float) -> float:
        top = self._live_top(self._by_arrival)
        return 0.0 if top is None else max(0.0, now - top[0])

    def _live_top(self, heap: list[tuple[float, int]]) -> tuple[float, int] | None:
        """The least item of ``heap`` whose entry still waits (the others dropped)."""
        entries = self._entries
        while heap and heap[0][1] not in entries:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _rebuild_heaps(self) -> None:
        """Only the live entries: bounds the heaps when entries leave from inside them."""
        entries = self._entries.values()
        self._by_deadline = [(e.deadline, e.seq) for e in entries]
        self._by_arrival = [(e.enqueued_at, e.seq) for e in entries]
        heapq.heapify(self._by_deadline)
        heapq.heapify(self._by_arrival)

    def drain(
        self,
        place: Callable[[QueuedRequest[P]], R | None],
        exhausted: Callable[[], bool] = lambda: False,
    ) -> list[tuple[QueuedRequest[P], R]]:
        """Offer entries to ``place`` in FCFS order; remove and return those it placed.

        ``place`` returns None for an entry that must keep waiting; later
        entries are still offered (a request forwarded in may not go to a peer,
        but the one behind it may).  ``exhausted`` is checked before each offer
        so a drain over a long queue stops as soon as nothing is available.
        """
        placed: list[tuple[QueuedRequest[P], R]] = []
        for entry in self:
            if exhausted():
                break
            result = place(entry)
            if result is not None:
                del self._entries[entry.seq]
                placed.append((entry, result))
        return placed


class RegionalQueues(Generic[P]):
    """One ``PendingQueue`` per model, with bounds following the topology."""

    def __init__(self, *, default_max_len: int = 1024, default_max_wait_s: float = 30.0) -> None:
        self._defaults = (default_max_len, default_max_wait_s)
        self._queues: dict[str, PendingQueue[P]] = {}
        self._bounds: dict[str, tuple[int, float]] = {}

    def configure(self, bounds: Mapping[str, tuple[int, float]]) -> None:
        """Adopt (max_len, max_wait_s) per model; waiting entries keep their deadlines."""
        self._bounds = dict(bounds)
        for model, queue in self._queues.items():
            queue.max_len, queue.max_wait_s = self._bounds.get(model, self._defaults)
        # Bounded state: an empty queue of a model that left takes no room.
        for model in [m for m, q in self._queues.items() if not q and m not in self._bounds]:
            del self._queues[model]

    def for_model(self, model: str) -> PendingQueue[P]:
        queue = self._queues.get(model)
        if queue is None:
            max_len, max_wait_s = self._bounds.get(model, self._defaults)
            queue = self._queues[model] = PendingQueue(
                model, max_len=max_len, max_wait_s=max_wait_s
            )
        return queue

    def items(self) -> list[tuple[str, PendingQueue[P]]]:
        return sorted(self._queues.items())

    def lengths(self) -> dict[str, int]:
        return {model: len(q) for model, q in self.items()}

    def total(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def next_deadline(self) -> float | None:
        deadlines = [d for q in self._queues.values() if (d := q.next_deadline()) is not None]
        return min(deadlines, default=None)

    def expire(self, now: float) -> list[QueuedRequest[P]]:
        return [entry for q in self._queues.values() for entry in q.expire(now)]
