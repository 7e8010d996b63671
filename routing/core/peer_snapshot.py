"""SkyLB's regional snapshot for a cost model: what this region forwarded to each peer.

A balancer cannot see a peer region's caches.  What it does know is what it sent
there: a prompt forwarded to a peer was prefilled there, and the peer's own
prefix-aware routing sends a later prompt with the same prefix to the replica
holding it.  SkyLB keeps that as a "partial view (snapshot) of other load
balancers ... all historical requests that the local region has sent to remote
regions" (SkyLB §3.2) and forwards to the region with the highest prefix hit.

``PeerSnapshot`` is that view for a policy that prices options: a radix tree of
the block hashes forwarded, with each peer as a tenant, so ``cached_tokens``
tells how much of a prompt each peer probably holds.  It is an estimate in both
directions: the peer may have evicted the prefix since (each peer is bounded
to ``max_blocks_per_peer``, one replica's KV capacity, least recently forwarded
first, as the engine's LRU would), and the peer may hold prefixes its own
clients sent, which this region never hears of.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from routing.core.radix_tree import RadixTree


class PeerSnapshot:
    """Prefixes this balancer forwarded, per peer, bounded per peer."""

    def __init__(self, max_blocks_per_peer: int, block_tokens: int) -> None:
        self.tree = RadixTree(max_blocks_per_peer)
        self.block_tokens = block_tokens

    def record(self, blocks: Sequence[int], peer_id: str) -> None:
        """``blocks`` (a prompt's block hashes) were forwarded to ``peer_id``."""
        self.tree.insert(blocks, peer_id)

    def cached_tokens(
        self, blocks: Sequence[int], prompt_tokens: int, peer_ids: Collection[str]
    ) -> dict[str, int]:
        """Prompt tokens each peer in ``peer_ids`` probably holds, for those holding any."""
        if not blocks:
            return {}
        depths = self.tree.match_depths(blocks, peer_ids)
        size = self.block_tokens
        return {peer: min(prompt_tokens, depth * size) for peer, depth in depths.items()}

    def forget(self, peer_id: str) -> None:
        self.tree.remove_tenant(peer_id)
