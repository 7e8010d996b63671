"""Push-based cache-map routing: sticky least-loaded among the replicas that hold the prefix.

The routing algorithm of "Stateful Cache-Aware Routing" (002, Algorithm 1,
"Sticky-Least-Loaded with Speculative Updates") over a ``CacheMap`` that the
control plane keeps current from the engines' KV events (BlockStored /
BlockRemoved / AllBlocksCleared, plus periodic destructive syncs):

1. Find the longest prefix of the request's block hashes held by an available
   candidate (confirmed or speculative).  002 hashes one fixed-length prefix
   (64 tokens by default); chained 16-token block hashes let Meridian find the
   *longest* held prefix instead, so a long shared document beats a short
   shared system prompt.
2. Hit: the least-loaded replica among those holders (stickiness keeps the
   locality, least-loaded spreads a hot prefix held by several replicas).
3. Miss: the least-loaded candidate overall.
4. Speculative insert: the request's first ``max_speculative_blocks`` blocks
   that the chosen replica has not confirmed are recorded for it at once,
   marked speculative; its BlockStored events confirm them and unconfirmed ones
   expire after ``speculative_ttl_s``.  (002 speculates on a miss; doing it for
   the unconfirmed tail of a hit too keeps a burst on the same replica.)
   A failed request withdraws its speculation (``on_complete`` with ok False).

The control plane reaches the map as ``policy.cache_map``.  Bounds are the
map's: ``max_blocks_per_replica`` entries per replica (131,072 blocks = 2M
tokens, above any one GPU's KV capacity, so a faithful mirror never hits it)
and ``max_speculative`` speculative entries in all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.cache_map import CacheMap
from core.policy import PolicyBase, least_loaded
from core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class CacheMapConfig:
    max_blocks_per_replica: int = 131_072
    # Long enough for a queued 32k-token prefill to finish and its BlockStored to arrive.
    speculative_ttl_s: float = 30.0
    max_speculative: int = 262_144
    max_speculative_blocks: int = 512

    def __post_init__(self) -> None:
        if self.max_blocks_per_replica < 1 or self.max_speculative < 0:
            raise ValueError("max_blocks_per_replica must be >= 1, max_speculative >= 0")
        if self.speculative_ttl_s <= 0 or self.max_speculative_blocks < 0:
            raise ValueError("speculative_ttl_s must be > 0, max_speculative_blocks >= 0")


class CacheMapPolicy(PolicyBase):
    name = "cache_map"

    def __init__(
        self, config: CacheMapConfig | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or CacheMapConfig()
        self.cache_map = CacheMap(
            max_blocks_per_replica=self.config.max_blocks_per_replica,
            speculative_ttl_s=self.config.speculative_ttl_s,
            max_speculative=self.config.max_speculative,
            clock=clock,
        )
        self.kv_sink = self.cache_map

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        if not candidates:
            return None
        self.cache_map.expire()
        chosen, held = self._sticky(request, candidates)
        if chosen is None:
            chosen, held = least_loaded(candidates), 0
        if chosen is not None:
            # The first ``held`` blocks are already recorded for the chosen holder.
            blocks = request.block_hashes[held : self.config.max_speculative_blocks]
            self.cache_map.speculate(chosen.target_id, blocks)
        return chosen

    def on_complete(self, request: RequestDescriptor, target: TargetState, ok: bool) -> None:
        if not ok:
            blocks = request.block_hashes[: self.config.max_speculative_blocks]
            self.cache_map.forget_speculative(target.target_id, blocks)

    def on_targets_changed(self, target_ids: Sequence[str]) -> None:
        self.cache_map.retain(target_ids)

    def learn_route(self, blocks: Sequence[int], target_id: str) -> None:
        """A sibling process routed ``blocks`` to ``target_id``: speculate as it did
        (the engine's KV events confirm or expire the entries in every process)."""
        self.cache_map.speculate(target_id, blocks[: self.config.max_speculative_blocks])

    def _sticky(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> tuple[TargetState | None, int]:
        """The least-loaded holder of the longest held prefix, and that prefix's length."""
        if not request.block_hashes:
            return None, 0
        by_id = {t.target_id: t for t in candidates}
        depth, holders = self.cache_map.longest_prefix(request.block_hashes, by_id.keys())
        return least_loaded(by_id[r] for r in holders), depth
