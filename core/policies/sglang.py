"""SGLang's cache-aware routing (``sgl-router`` ``cache_aware`` policy), over block hashes.

SGLang keeps an approximate radix tree of what it sent to each worker
(``RadixTree``) and routes in two modes:

* **Imbalanced** — when ``max_load - min_load > balance_abs_threshold`` *and*
  ``max_load > min_load * balance_rel_threshold`` among the candidates, cache
  affinity is ignored and the least-loaded candidate is chosen (shortest
  queue).  The request is still inserted into the chosen worker's tree, so the
  tree keeps tracking where prefixes went.
* **Balanced** — match the prompt in the tree: if the best available tenant's
  match rate (matched blocks / prompt blocks) is at least ``cache_threshold``,
  choose it (least loaded among equally deep matches); otherwise choose the
  candidate with the *smallest* tree, i.e. the most cache capacity to spare, so
  new prefixes spread over the workers.  Either way the prompt is inserted for
  the chosen worker.

Load is this balancer's outstanding count per target (SGLang's router counts
its own running requests the same way).  Defaults are SGLang's:
``cache_threshold=0.3``, ``balance_abs_threshold=64``,
``balance_rel_threshold=1.5``; note that with the balancer's per-replica
outstanding cap (SP-O, 32 by default) an absolute gap of 64 can never occur
locally, so set ``balance_abs_threshold`` below the cap to make the imbalance
mode reachable.  SGLang's ``max_tree_size`` counts characters (2^26); Meridian
counts 16-token blocks, and 65,536 blocks = 1M tokens per target is about the
KV capacity of one 80 GB GPU serving an 8B model, so the approximation never
believes a replica holds more than it could.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.policy import PolicyBase, least_loaded, load_key
from core.radix_tree import RadixTree
from core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class SGLangConfig:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    max_blocks_per_target: int = 65_536
    evict_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be within [0, 1]")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0, balance_rel_threshold >= 1")
        if self.max_blocks_per_target < 1:
            raise ValueError("max_blocks_per_target must be at least 1")


class SGLangPolicy(PolicyBase):
    name = "sglang"

    def __init__(self, config: SGLangConfig | None = None) -> None:
        self.config = config or SGLangConfig()
        self.tree = RadixTree(self.config.max_blocks_per_target, self.config.evict_fraction)

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        if not candidates:
            return None
        if self.imbalanced(candidates):
            chosen = least_loaded(candidates)
        else:
            chosen = self._cached(request, candidates) or self._emptiest(candidates)
        if chosen is not None:
            # Recorded in both modes, so the tree follows the prefix even when load won.
            self.tree.insert(request.block_hashes, chosen.target_id)
        return chosen

    def on_targets_changed(self, target_ids: Sequence[str]) -> None:
        self.tree.retain_tenants(target_ids)

    def learn_route(self, blocks: Sequence[int], target_id: str) -> None:
        """A sibling process routed ``blocks`` to ``target_id``: as if this one had."""
        self.tree.insert(blocks, target_id)

    def imbalanced(self, candidates: Sequence[TargetState]) -> bool:
        loads = [t.global_outstanding for t in candidates]
        high, low = max(loads), min(loads)
        return (
            high - low > self.config.balance_abs_threshold
            and high > low * self.config.balance_rel_threshold
        )

    def _cached(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        blocks = request.block_hashes
        if not blocks:
            return None
        by_id = {t.target_id: t for t in candidates}
        depth, tenants = self.tree.match(blocks, by_id.keys())
        if depth == 0 or depth / len(blocks) < self.config.cache_threshold:
            return None
        return least_loaded(by_id[t] for t in tenants)

    def _emptiest(self, candidates: Sequence[TargetState]) -> TargetState:
        return min(candidates, key=lambda t: (self.tree.size(t.target_id), load_key(t)))
