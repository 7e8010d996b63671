"""SkyLB: route to the available target with the longest matching prefix (SkyLB §3.2).

Explicitly prefix-aware routing over a ``PrefixTrie`` of block hashes
(Algorithm 1, lines 18-21, MAXPREFIXMATCH).  Locally the trie's targets are
this balancer's replicas; the same class on the remote layer
(``remote_policy_name("skylb")`` is ``skylb``) is the *regional snapshot*: a
trie of what this region forwarded to which peer balancer.

Per request:

1. Match the request's block hashes against the trie, keeping only targets in
   ``candidates`` (already SP-P/SP-O-available, §3.3); the walk stops at the
   first node without an available target.
2. If some available target matched at least ``min_match_ratio`` of the
   prompt's blocks (and at least one block), pick among the deepest-matching
   ones the least loaded.  The paper's Algorithm 1 is ``min_match_ratio = 0``
   (any match wins); §5.2 notes that exploring underutilized replicas when the
   hit ratio is low (e.g. < 50%) is what makes SkyLB beat SkyLB-CH under
   bursts, which a ratio such as 0.5 reproduces.
3. Otherwise pick the least-loaded candidate.
4. Insert the request's path for the chosen target *now*, at decision time, so
   a burst of requests sharing a new prefix follows the first one.

State is bounded by ``max_nodes`` trie nodes (one per 16-token block),
evicting the oldest insertions first; ``on_targets_changed`` drops targets
that left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.policy import PolicyBase, least_loaded
from core.prefix_trie import PrefixTrie
from core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class SkyLBConfig:
    # 200k blocks = 3.2M tokens of distinct prefixes, tens of MB at most.
    max_nodes: int = 200_000
    min_match_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.max_nodes < 1:
            raise ValueError("max_nodes must be at least 1")
        if not 0.0 <= self.min_match_ratio <= 1.0:
            raise ValueError("min_match_ratio must be within [0, 1]")


class SkyLBPolicy(PolicyBase):
    name = "skylb"

    def __init__(self, config: SkyLBConfig | None = None) -> None:
        self.config = config or SkyLBConfig()
        self.trie = PrefixTrie(self.config.max_nodes)

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        if not candidates:
            return None
        chosen = self._best_match(request, candidates) or least_loaded(candidates)
        if chosen is not None:
            self.trie.insert(request.block_hashes, chosen.target_id)
        return chosen

    def on_targets_changed(self, target_ids: Sequence[str]) -> None:
        self.trie.retain_targets(target_ids)

    def learn_route(self, blocks: Sequence[int], target_id: str) -> None:
        """A sibling process routed ``blocks`` to ``target_id``: as if this one had."""
        self.trie.insert(blocks, target_id)

    def _best_match(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        blocks = request.block_hashes
        if not blocks:
            return None
        by_id = {t.target_id: t for t in candidates}
        depth, matched = self.trie.match(blocks, by_id.keys())
        if depth == 0 or depth < self.config.min_match_ratio * len(blocks):
            return None
        return least_loaded(by_id[t] for t in matched)
