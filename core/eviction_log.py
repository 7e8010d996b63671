"""Which blocks each replica's engine removed, in the order it removed them (pure).

The hit-rate mismatch detector (``core.cache_view_check``) compares the cached
tokens the cache map expected when a request was routed with those the engine
reported when it finished.  The engine finding less has two causes that need
opposite fixes: the view was wrong when the request was routed (keys unlike the
engine's, events lost), or the view was right and the engine evicted the prefix
while the request waited for it, as a KV cache does when it thrashes.  The
engine's own ``BlockRemoved`` events tell them apart: a request whose expected
blocks were removed after it was routed lost them to eviction.

Removals are counted per replica.  ``mark`` is the count when a request is
routed; ``removed_since`` asks whether any of the given blocks was removed since.  The
log keeps the last ``capacity`` removals of each replica (a block removed twice
is kept once, at its latest removal): a request that outlived more removals than
that saw its replica's cache churn more than the log holds, which is eviction
enough to explain what it lost.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

# Removals remembered per replica: 4,096 blocks (64k tokens at 16 a block), in about
# 0.7 MB (measured with tracemalloc, the hashes' own ints aside).  An engine that
# prefills only cold prompts evicts that many in about 35 s at the L4 profile's rate
# (0.53 ms a token) and 2.6 s at the H100's (0.04 ms); a request that waits longer than
# that in such an engine counts as evicted (``removed_since``).
DEFAULT_CAPACITY = 4096


class EvictionLog:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._counts: dict[str, int] = {}
        self._removed: dict[str, OrderedDict[int, int]] = {}

    def mark(self, replica: str) -> int:
        """The count of ``replica``'s removals so far (a request routed now)."""
        return self._counts.get(replica, 0)

    def record(self, replica: str, block_hashes: Iterable[int]) -> None:
        """``replica``'s engine removed these blocks, in this order."""
        log = self._removed.get(replica)
        if log is None:
            log = self._removed[replica] = OrderedDict()
        count = self._counts.get(replica, 0)
        for h in block_hashes:
            log.pop(h, None)
            log[h] = count
            count += 1
        self._counts[replica] = count
        while len(log) > self.capacity:
            log.popitem(last=False)

    def removed_since(self, replica: str, block_hashes: Iterable[int], mark: int) -> bool:
        """Whether ``replica`` removed any of ``block_hashes`` after ``mark``."""
        count = self._counts.get(replica, 0)
        if count <= mark:
            return False
        if count - mark > self.capacity:
            return True  # more removals since than the log remembers
        log = self._removed[replica]
        return any(log.get(h, -1) >= mark for h in block_hashes)

    def retain(self, replicas: Iterable[str]) -> None:
        """Forget replicas that left (bounded state)."""
        keep = frozenset(replicas)
        for replica in [r for r in self._counts if r not in keep]:
            del self._counts[replica]
            self._removed.pop(replica, None)
