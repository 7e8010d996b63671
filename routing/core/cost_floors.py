"""Replicas in the orders Meridian's walk over cold replicas stops by.

``MeridianPolicy._cheapest`` prices the replicas holding part of a prompt one by
one; the others (cold: their uncached tokens are the whole prompt) it walks from
this index, in an order where a lower bound of every replica not yet priced is
known, and stops once that bound cannot beat the best price found.  The index
keeps three orders of the same replicas, each a sorted list of ``(key, id)``,
re-filed (O(log n) search, one list move) whenever a ledger, a learned rate or a
probe's KV usage changes:

* ``by_floor``: queued prefill seconds plus the KV pressure of the ledger alone.
  No price of the replica goes under it, for any request: the single order for a
  request whose own KV (prompt plus look-ahead decode) fits in the capacity.
* ``by_base`` and ``by_slope``: for a request whose own KV ``a`` is at least the
  capacity, every replica overflows, and its pressure is exactly
  ``alpha + slope * (a - capacity)``, with ``held = max(ledger, usage x capacity)``,
  ``slope = lifetime / max(1, held)`` and ``alpha = lifetime`` (0 on a replica
  holding nothing); ``lifetime`` is its mean output times its seconds per token.
  ``base`` is the queued prefill seconds plus ``alpha``.  The price is increasing
  in both keys, so the walk takes the two lists in turn (Fagin's threshold
  algorithm): every replica not yet priced has ``base`` and ``slope`` at least
  those under the two cursors, which bounds its price.  ``held`` depends on the
  probe's ``kv_usage``, so the policy re-files a replica on every probe
  (``observe_probe``): without it no bound could see that a fuller replica frees
  room sooner, and a prompt larger than the capacity priced every cold replica.

Plain data, no I/O: the policy computes the keys and files them.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Container, KeysView


class CostFloors:
    """Three sorted orders of one set of replicas, and the probe usage filed for each."""

    def __init__(self) -> None:
        self.by_floor: list[tuple[float, str]] = []
        self.by_base: list[tuple[float, str]] = []
        self.by_slope: list[tuple[float, str]] = []
        self._keys: dict[str, tuple[float, float, float]] = {}

    def __contains__(self, target_id: object) -> bool:
        return target_id in self._keys

    def ids(self) -> KeysView[str]:
        return self._keys.keys()

    def file(self, target_id: str, floor: float, base: float, slope: float) -> None:
        """Move ``target_id`` to its place in each order (a no-op when nothing moved)."""
        keys = (floor, base, slope)
        old = self._keys.get(target_id)
        if old == keys:
            return
        lists = (self.by_floor, self.by_base, self.by_slope)
        for ordered, new_key, old_key in zip(lists, keys, old or keys, strict=True):
            if old is not None:
                if old_key == new_key:
                    continue
                del ordered[bisect_left(ordered, (old_key, target_id))]
            insort(ordered, (new_key, target_id))
        self._keys[target_id] = keys

    def retain(self, keep: Container[str]) -> None:
        """Forget every replica not in ``keep``."""
        self.by_floor = [k for k in self.by_floor if k[1] in keep]
        self.by_base = [k for k in self.by_base if k[1] in keep]
        self.by_slope = [k for k in self.by_slope if k[1] in keep]
        self._keys = {k: v for k, v in self._keys.items() if k in keep}
