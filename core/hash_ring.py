"""A ring hash (Karger et al. 1997) with virtual nodes and availability-aware walks.

Each target owns ``vnodes`` points on a 64-bit ring; a key belongs to the
first point clockwise from its hash.  Adding or removing one of N targets moves
only the keys of that target's arcs, about 1/N of all keys, so sessions keep
their replica (and its KV cache) across scale events.  Many virtual nodes per
target (100-160 is the usual range) keep the arcs even: with 128 the busiest
target's share stays within roughly ±20% of fair.

``lookup`` takes an ``accept`` predicate and walks on past points whose target
is not accepted: SkyLB-CH's availability skip (SkyLB §3.2, Algorithm 1 line
26), which also serves plain consistent hashing when the owner is unhealthy.

Hashes are blake2b, never Python's ``hash()``, so every balancer process (and
every machine) builds the identical ring.  Size is bounded: exactly
``vnodes x targets`` points; the ring is rebuilt only when the target set
changes.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Callable, Iterable

DEFAULT_VNODES = 128
_RING_BITS = 64


def stable_hash(key: str | bytes) -> int:
    """A 64-bit hash that is the same in every process (unlike ``hash()``)."""
    data = key.encode() if isinstance(key, str) else key
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """Sorted vnode points of the known targets; immutable between rebuilds."""

    def __init__(self, target_ids: Iterable[str] = (), vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < 1:
            raise ValueError("vnodes must be at least 1")
        self.vnodes = vnodes
        self._targets: frozenset[str] = frozenset()
        self._points: list[int] = []
        self._owners: list[str] = []
        self.rebuild(target_ids)

    @property
    def targets(self) -> frozenset[str]:
        return self._targets

    def __len__(self) -> int:
        return len(self._points)

    def __contains__(self, target_id: object) -> bool:
        return target_id in self._targets

    def rebuild(self, target_ids: Iterable[str]) -> None:
        """Replace the ring's target set; a no-op when it is unchanged."""
        targets = frozenset(target_ids)
        if targets == self._targets and self._points:
            return
        points = sorted(
            (stable_hash(f"{target}#{i}"), target) for target in targets for i in range(self.vnodes)
        )
        self._targets = targets
        self._points = [p for p, _ in points]
        self._owners = [t for _, t in points]

    def add(self, target_ids: Iterable[str]) -> None:
        self.rebuild(self._targets | frozenset(target_ids))

    def owner(self, key_hash: int) -> str | None:
        """The target owning ``key_hash``, ignoring availability."""
        return self.lookup(key_hash, lambda _: True)

    def lookup(self, key_hash: int, accept: Callable[[str], bool]) -> str | None:
        """The first target clockwise from ``key_hash`` that ``accept`` admits."""
        points = self._points
        if not points:
            return None
        start = bisect_left(points, key_hash % (1 << _RING_BITS))
        owners = self._owners
        count = len(points)
        rejected: set[str] = set()
        for step in range(count):
            target = owners[(start + step) % count]
            if target in rejected:
                continue
            if accept(target):
                return target
            rejected.add(target)
            # Every target was seen and refused: no need to walk the rest of the ring.
            if len(rejected) == len(self._targets):
                return None
        return None
