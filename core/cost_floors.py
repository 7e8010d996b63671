"""Replicas in the orders Meridian's walk over cold replicas stops by.

Meridian's walk (``ReplicaBook.cheapest``) prices the replicas holding part of a
prompt one by one; the others (cold: their uncached tokens are the whole prompt) it walks from
this index, in an order where a lower bound of every replica not yet priced is
known, and stops once that bound cannot beat the best price found.  The index
keeps three orders of the same replicas, each a sorted list of ``(key, id)``,
re-filed (O(log n) search, one list move) when a ledger, a learned rate or a
probe's KV usage changes:

* ``by_floor``: queued prefill seconds and the wait for a batch slot, plus the KV
  pressure of the ledger alone.  No price of the replica goes under it, for any
  request: the single order for a request whose own KV (prompt plus look-ahead
  decode) fits in the capacity.
* ``by_base`` and ``by_slope``: for a request whose own KV ``a`` is at least the
  capacity, every replica overflows, and its pressure is exactly
  ``alpha + slope * (a - capacity)``, with ``held = max(ledger, usage x capacity)``,
  ``slope = lifetime / max(1, held)`` and ``alpha = lifetime`` (0 on a replica
  holding nothing); ``lifetime`` is its mean output times its seconds per token.
  ``base`` is the queued prefill seconds and the slot wait plus ``alpha``.  The price
  is increasing in both keys, so the walk takes the two lists in turn (Fagin's threshold
  algorithm): every replica not yet priced has ``base`` and ``slope`` at least
  those under the two cursors, which bounds its price.  ``held`` depends on the
  probe's ``kv_usage``, so a probe (``observe_probe``) re-files the replica as a
  ledger change does: without it no bound could see that a fuller replica frees
  room sooner, and a prompt larger than the capacity priced every cold replica.

Plain data, no I/O: the policy computes the keys and files them.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Container, Iterator, KeysView


class CostFloors:
    """Three sorted orders of one set of replicas.

    ``by_floor`` is re-filed at once; ``by_base`` and ``by_slope`` only serve requests
    larger than the KV capacity, so a change marks the replica ``stale`` and the
    policy re-files the stale ones before such a walk (``file_overflow``): a
    decision that fits pays one list move per change, not three.
    """

    def __init__(self) -> None:
        self.by_floor: list[tuple[float, str]] = []
        self.by_base: list[tuple[float, str]] = []
        self.by_slope: list[tuple[float, str]] = []
        self.stale: set[str] = set()
        self._floor: dict[str, float] = {}
        self._overflow: dict[str, tuple[float, float]] = {}

    def __contains__(self, target_id: object) -> bool:
        return target_id in self._floor

    def ids(self) -> KeysView[str]:
        return self._floor.keys()

    def file_floor(self, target_id: str, floor: float) -> None:
        """Move ``target_id`` to its place by ``floor``; its other keys go stale."""
        self.stale.add(target_id)
        old = self._floor.get(target_id)
        if old == floor:
            return
        if old is not None:
            del self.by_floor[bisect_left(self.by_floor, (old, target_id))]
        insort(self.by_floor, (floor, target_id))
        self._floor[target_id] = floor

    def file_overflow(self, target_id: str, base: float, slope: float) -> None:
        """Move ``target_id`` to its places by ``base`` and ``slope``."""
        self.stale.discard(target_id)
        old = self._overflow.get(target_id)
        if old == (base, slope):
            return
        for ordered, new_key, old_key in (
            (self.by_base, base, old[0] if old else None),
            (self.by_slope, slope, old[1] if old else None),
        ):
            if old_key == new_key:
                continue
            if old_key is not None:
                del ordered[bisect_left(ordered, (old_key, target_id))]
            insort(ordered, (new_key, target_id))
        self._overflow[target_id] = (base, slope)

    def overflow_order(self, excess: int) -> Iterator[tuple[float, str]]:
        """``(bound, id)`` over every replica once, for a request whose own KV is
        ``excess`` tokens over the capacity: ``by_base`` and ``by_slope`` taken in
        turn, each id with ``base + excess * slope`` of the two cursors when it
        came up, a bound on that replica and on every one after it.  Call only
        with no replica ``stale``."""
        first, second = self.by_base, self.by_slope
        size = len(first)
        seen: set[str] = set()
        i = j = 0
        while i < size and j < size:
            bound = first[i][0] + excess * second[j][0]
            if (i + j) % 2:
                target_id = second[j][1]
                j += 1
            else:
                target_id = first[i][1]
                i += 1
            if target_id not in seen:
                seen.add(target_id)
                yield bound, target_id

    def retain(self, keep: Container[str]) -> None:
        """Forget every replica not in ``keep``."""
        self.by_floor = [k for k in self.by_floor if k[1] in keep]
        self.by_base = [k for k in self.by_base if k[1] in keep]
        self.by_slope = [k for k in self.by_slope if k[1] in keep]
        self.stale = {k for k in self.stale if k in keep}
        self._floor = {k: v for k, v in self._floor.items() if k in keep}
        self._overflow = {k: v for k, v in self._overflow.items() if k in keep}
