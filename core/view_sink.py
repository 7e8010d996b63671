"""A policy's KV-event sink with a map of confirmed blocks beside it (pure).

The hit-rate mismatch detector (``core.cache_view_check``) compares what routing
expected a replica to have cached with what the engine reported, and reads the
expectation off a ``CacheMap``: the blocks the engine's own events confirmed.  The
``cache_map`` policy routes by such a map.  A policy that keeps its holdings some
other way (the ``meridian`` policy's radix tree, with ``tree_from_kv_events``) has
none, and a wrong hash seed or tokenizer there went unreported: its events matched
nothing, the tree just never learned what the engines evicted.  ``ViewedSink``
hands every event to the policy's sink and to such a map, kept for the check alone
(no speculation: routing never reads it).
"""

from __future__ import annotations

from collections.abc import Sequence

from core.cache_map import CacheMap
from core.event_keys import CacheEventSink

# As many blocks per replica as the cache_map policy's map keeps (2M tokens of 16).
VIEW_MAX_BLOCKS_PER_REPLICA = 131_072


def view_map() -> CacheMap:
    """A map of confirmed blocks only: nothing is speculated into it."""
    return CacheMap(
        max_blocks_per_replica=VIEW_MAX_BLOCKS_PER_REPLICA,
        speculative_ttl_s=1.0,
        max_speculative=0,
    )


class ViewedSink:
    """``sink``, and ``view`` told the same events in the same order."""

    def __init__(self, sink: CacheEventSink, view: CacheMap) -> None:
        self.sink = sink
        self.view = view

    def apply_stored(self, replica: str, block_hashes: Sequence[int]) -> None:
        self.sink.apply_stored(replica, block_hashes)
        self.view.apply_stored(replica, block_hashes)

    def apply_removed(self, replica: str, block_hashes: Sequence[int]) -> None:
        self.sink.apply_removed(replica, block_hashes)
        self.view.apply_removed(replica, block_hashes)

    def clear(self, replica: str) -> None:
        self.sink.clear(replica)
        self.view.clear(replica)
