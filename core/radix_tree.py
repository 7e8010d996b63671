"""SGLang's approximate radix tree: one shared tree, per-target ("tenant") ownership.

SGLang's cache-aware router (``sgl-router``, ``tree.rs``) keeps one radix tree
of the prompts it routed, each node labelled with the workers ("tenants") it
was sent to and when, as an *approximation* of every worker's prefix cache:
the router never hears about evictions, so it evicts on its own, per tenant,
least-recently-used leaves first, once a tenant's share exceeds
``max_tree_size``.  SGLang keys the tree by characters; Meridian keys it by the
16-token chained block hashes the replicas cache, so "size" is in blocks and
matches the unit the engines evict in.

Edges are compressed (a node holds a run of block hashes), so a 32k-token
prompt is one node until another prompt diverges from it.  A tenant holding a
node holds all its ancestors (insertions add whole paths; eviction removes a
tenant's leaves first), which lets ``match`` stop at the first node without an
available tenant.

Bound and eviction: each tenant holds at most ``max_blocks_per_tenant``
blocks.  When an insertion pushes it over, its least-recently-inserted leaves
are removed until it is back under ``(1 - evict_fraction)`` of the bound (the
slack amortises the scan over many insertions, as SGLang's periodic eviction
thread does); the last leaf is cut rather than dropped whole when only part of
it must go, and a node left with no tenant is removed.  Total size is thus at
most tenants x bound blocks.

What the engines evict (``release``): where the engines publish KV events
(vLLM's ``BlockRemoved``), the tree need not guess.  A tree built with
``index_blocks`` keeps a map from each block hash to the node whose edge holds
it (or, once that edge was split, the node below it), so a removed block cuts
its engine's hold from that block down: an engine
that evicted a block can no longer serve a prefix through it.  Block hashes are
chained (each names its whole prefix), so a hash sits in one place in the tree.
Trees without the index (SGLang's, which never hears of evictions) pay nothing
for it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from itertools import count, repeat


class RadixNode:
    __slots__ = ("children", "edge", "parent", "tenants")

    def __init__(self, edge: tuple[int, ...], parent: RadixNode | None) -> None:
        self.edge = edge
        self.parent = parent
        self.children: dict[int, RadixNode] = {}
        # tenant id -> tick of the latest insertion through this node
        self.tenants: dict[str, int] = {}


def common_prefix(edge: tuple[int, ...], seq: tuple[int, ...], start: int) -> int:
    """How many leading hashes of ``edge`` equal ``seq[start:]``.

    Slice comparison runs in C; a binary search on it finds the divergence point
    in O(log n) comparisons instead of a Python loop over 2048-block edges.
    """
    n = min(len(edge), len(seq) - start)
    if seq[start : start + n] == edge[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if seq[start : start + mid] == edge[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RadixTree:
    """A compressed prefix tree of block hashes with per-tenant LRU eviction."""

    def __init__(
        self, max_blocks_per_tenant: int, evict_fraction: float = 0.1, *, index_blocks: bool = False
    ) -> None:
        if max_blocks_per_tenant < 1:
            raise ValueError("max_blocks_per_tenant must be at least 1")
        if not 0.0 <= evict_fraction < 1.0:
            raise ValueError("evict_fraction must be within [0, 1)")
        self.max_blocks_per_tenant = max_blocks_per_tenant
        self.evict_fraction = evict_fraction
        self.low_water = int(max_blocks_per_tenant * (1.0 - evict_fraction))
        # Tenants with a bound of their own (``set_bound``): blocks, low-water mark.
        self._bounds: dict[str, tuple[int, int]] = {}
        self.root = RadixNode((), None)
        self._tick = 0
        # Bumped by every change of what any tenant holds (insert, eviction, removal):
        # what is derived from the tree (a region's prefix digest) is cached by it.
        self.version = 0
        self._sizes: dict[str, int] = {}
        # Reverse index: the nodes each tenant holds, for eviction and removal.
        self._nodes: dict[str, dict[RadixNode, None]] = {}
        # Block hash -> the node whose edge holds it, or one below it (``_holder_of``);
        # None: not kept.
        self._where: dict[int, RadixNode] | None = {} if index_blocks else None

    def size(self, tenant: str) -> int:
        """Blocks ``tenant`` holds in the tree (SGLang's per-tenant tree size)."""
        return self._sizes.get(tenant, 0)

    def tenants(self) -> list[str]:
        return sorted(self._sizes)

    def node_count(self) -> int:
        return len({n for nodes in self._nodes.values() for n in nodes})

    def insert(self, hashes: Sequence[int], tenant: str) -> None:
        """Record that ``hashes`` was routed to ``tenant`` (refreshing its recency)."""
        seq = tuple(hashes)
        if not seq:
            return
        self._tick += 1
        self.version += 1
        node, i = self.root, 0
        while i < len(seq):
            child = node.children.get(seq[i])
            if child is None:
                child = node.children[seq[i]] = RadixNode(seq[i:], node)
                if self._where is not None:
                    self._where.update(dict.fromkeys(child.edge, child))
                self._hold(child, tenant)
                break
            k = common_prefix(child.edge, seq, i)
            if k < len(child.edge):
                child = self._split(child, k)
            self._hold(child, tenant)
            node, i = child, i + k
        bound, low_water = self._bounds.get(tenant, (self.max_blocks_per_tenant, self.low_water))
        if self._sizes[tenant] > bound:
            self._evict(tenant, low_water)

    def set_bound(self, tenant: str, max_blocks: int) -> None:
        """Bound ``tenant`` at ``max_blocks`` instead of the tree's bound (from its next
        insertion on)."""
        if max_blocks < 1:
            raise ValueError("max_blocks must be at least 1")
        self._bounds[tenant] = (max_blocks, int(max_blocks * (1.0 - self.evict_fraction)))

    def match(self, hashes: Sequence[int], available: Collection[str]) -> tuple[int, set[str]]:
        """Blocks of the longest prefix an available tenant holds, and those tenants."""
        seq = tuple(hashes)
        node, depth = self.root, 0
        alive: Collection[str] = available
        while depth < len(seq):
            child = node.children.get(seq[depth])
            if child is None:
                break
            deeper = child.tenants.keys() & alive
            if not deeper:
                break
            k = common_prefix(child.edge, seq, depth)
            alive, depth = deeper, depth + k
            if k < len(child.edge):
                break
            node = child
        return (depth, set(alive)) if depth else (0, set())

    def match_depths(self, hashes: Sequence[int], wanted: Collection[str]) -> dict[str, int]:
        """Blocks of the prompt each tenant in ``wanted`` holds, for those holding any.

        One walk down the prompt's path: a tenant holding a node holds its
        ancestors, so its depth is where it last appears.  The cost model scores
        every replica by its own match, not only the deepest ones.
        """
        seq = tuple(hashes)
        depths: dict[str, int] = {}
        node, depth = self.root, 0
        while depth < len(seq):
            child = node.children.get(seq[depth])
            if child is None:
                break
            k = common_prefix(child.edge, seq, depth)
            depth += k
            holders = child.tenants.keys() & wanted
            if not holders:
                break
            for tenant in holders:
                depths[tenant] = depth
            if k < len(child.edge):
                break
            node = child
        return depths

    def remove_tenant(self, tenant: str) -> None:
        """Forget ``tenant`` entirely; nodes left with no tenant disappear."""
        if tenant not in self._sizes:
            return  # holds nothing: what is derived from the tree stays valid
        self.version += 1
        for node in self._nodes.pop(tenant, {}):
            del node.tenants[tenant]
            if not node.tenants:
                self._detach(node)
        self._sizes.pop(tenant, None)

    def release(self, tenant: str, hashes: Iterable[int]) -> int:
        """``tenant``'s engine evicted ``hashes``: it holds neither them nor anything
        after them on their paths any more.  Returns the blocks it stopped holding.

        Needs ``index_blocks``.  Hashes the tree does not hold for ``tenant`` (never
        routed there, already cut, or forgotten by the tree's own bound) are skipped.
        """
        if self._where is None:
            raise RuntimeError("release needs a tree built with index_blocks=True")
        dropped = 0
        for block in hashes:
            node = self._holder_of(block)
            if node is None or tenant not in node.tenants:
                continue
            offset = node.edge.index(block)
            if offset:
                self._split(node, offset)  # the blocks above the evicted one stay held
            dropped += self._drop_below(node, tenant)
        if dropped:
            self.version += 1
        return dropped

    def retain_tenants(self, tenant_ids: Iterable[str]) -> None:
        keep = frozenset(tenant_ids)
        for tenant in [t for t in self._sizes if t not in keep]:
            self.remove_tenant(tenant)
        for tenant in [t for t in self._bounds if t not in keep]:
            del self._bounds[tenant]

    def held_paths(self, wanted: Collection[str]) -> list[tuple[int, int, RadixNode]]:
        """Every node some tenant in ``wanted`` holds, as ``(tick, depth, node)``:
        ``tick`` the latest insertion through it by one of them, ``depth`` the blocks
        above its edge.  One walk from the root over held nodes only (a tenant holding
        a node holds its ancestors), so a node's tick is never newer than its
        parent's: in order of recency, a path's shallower nodes come first."""
        out: list[tuple[int, int, RadixNode]] = []
        stack: list[tuple[RadixNode, int]] = [(self.root, 0)]
        while stack:
            node, depth = stack.pop()
            below = depth + len(node.edge)
            for child in node.children.values():
                ticks = [tick for tenant, tick in child.tenants.items() if tenant in wanted]
                if ticks:
                    out.append((max(ticks), below, child))
                    stack.append((child, below))
        return out

    # -- internals --------------------------------------------------------------------

    def _hold(self, node: RadixNode, tenant: str) -> None:
        if tenant not in node.tenants:
            self._sizes[tenant] = self._sizes.get(tenant, 0) + len(node.edge)
            self._nodes.setdefault(tenant, {})[node] = None
        node.tenants[tenant] = self._tick

    def _split(self, node: RadixNode, k: int) -> RadixNode:
        """Cut ``node``'s edge after ``k`` hashes; the new upper half is returned."""
        parent = node.parent
        assert parent is not None  # the root is never split: its edge is empty
        upper = RadixNode(node.edge[:k], parent)
        upper.tenants = dict(node.tenants)
        node.edge, node.parent = node.edge[k:], upper
        upper.children[node.edge[0]] = node
        parent.children[upper.edge[0]] = upper
        for tenant in upper.tenants:
            self._nodes[tenant][upper] = None
        # The index is left alone: the upper half's blocks still name the lower node,
        # and ``_holder_of`` walks up from it (re-filing them cost a long leaf's length
        # on every partial eviction).
        return upper

    def _holder_of(self, block: int) -> RadixNode | None:
        """The node whose edge holds ``block``: the one the index names, or an
        ancestor of it where the edge was split since (a detached node keeps its
        parent for this; its own blocks left the index with it)."""
        assert self._where is not None
        node = self._where.get(block)
        while node is not None and block not in node.edge:
            node = node.parent
        return node

    def _drop_below(self, top: RadixNode, tenant: str) -> int:
        """Remove ``tenant`` from ``top`` and every node under it; the blocks dropped."""
        dropped = 0
        nodes = self._nodes[tenant]
        stack = [top]
        while stack:
            node = stack.pop()
            stack.extend(c for c in node.children.values() if tenant in c.tenants)
            del node.tenants[tenant], nodes[node]
            dropped += len(node.edge)
            if not node.tenants:
                self._detach(node)
        self._sizes[tenant] -= dropped
        return dropped

    def _is_leaf_of(self, node: RadixNode, tenant: str) -> bool:
        return not any(tenant in c.tenants for c in node.children.values())

    def _evict(self, tenant: str, target_size: int) -> None:
        """Drop ``tenant``'s least recently inserted leaves until it fits ``target_size``.

        A leaf longer than the excess is cut and only its tail dropped, so one long
        prompt does not take a whole compressed edge's worth of blocks with it.
        """
        order = count()
        nodes = self._nodes[tenant]
        heap = [(n.tenants[tenant], next(order), n) for n in nodes if self._is_leaf_of(n, tenant)]
        heapq.heapify(heap)
        while heap and self._sizes[tenant] > target_size:
            _, _, node = heapq.heappop(heap)
            excess = self._sizes[tenant] - target_size
            if excess < len(node.edge):
                self._split(node, len(node.edge) - excess)
            del node.tenants[tenant], nodes[node]
            self._sizes[tenant] -= len(node.edge)
            parent = node.parent
            if not node.tenants:
                self._detach(node)
            if parent is not None and parent is not self.root and self._is_leaf_of(parent, tenant):
                heapq.heappush(heap, (parent.tenants[tenant], next(order), parent))

    def _detach(self, node: RadixNode) -> None:
        """Cut ``node`` from its parent.  It keeps its ``parent`` pointer: index entries
        of the blocks split off above it still name it, and lead up from it."""
        parent = node.parent
        if parent is not None and parent.children.get(node.edge[0]) is node:
            del parent.children[node.edge[0]]
        if self._where is not None:
            # A chained hash sits in one place in the tree: this edge's entries are
            # this node's.  map into a zero-length deque drops them in C.
            deque(map(self._where.pop, node.edge, repeat(None)), maxlen=0)
