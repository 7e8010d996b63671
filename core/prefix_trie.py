"""SkyLB's prefix trie: which targets served which prefixes (SkyLB §3.2).

A logical trie over a request's chained block hashes (one node per 16-token
block).  Each node records the targets a request through it was routed to,
with the insertion sequence number, so the path from the root to a node is a
prefix and the node's targets are where that prefix was sent.  The balancer
inserts at decision time: the path of the request is added and the chosen
target recorded at every node along it.

The same structure is the *regional snapshot* of the remote layer: a trie whose
targets are peer balancers, recording what this region forwarded where (§3.2:
cross-region prefix affinity is low, 2.5%, so this region's own forwards are
the prefixes worth matching remotely).

Matching (``match``) walks the request's path and keeps only targets that are
available (the caller's candidates).  Because a child's targets are always a
subset of its parent's (a target is recorded on the whole path), the walk stops
early at the first node with no available target: nothing deeper can have one.

Bound and eviction: at most ``max_nodes`` nodes.  Beyond it the oldest
insertions are evicted first ("starting with the earliest inserted records",
§3.2), where re-inserting a prefix refreshes it, so a popular system prompt
stays while one-off tails go.  Nodes are kept in touch order and
each insertion touches its path deepest-first, so a parent is always newer than
its children and the oldest node is always a leaf: eviction is O(1) per node
and never orphans a subtree.  Touches go to an append-only queue with lazy
deletion (cheaper per node than an ordered map), compacted once stale entries
outnumber live ones, so it stays within about twice the node bound.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from itertools import repeat


class TrieNode:
    __slots__ = ("children", "key", "parent", "stamp", "targets")

    def __init__(self, key: int, parent: TrieNode | None) -> None:
        self.key = key
        self.parent = parent
        # None until the first child: most nodes are leaves, and an empty dict per leaf
        # costs both memory and the time to build it on the insert path.
        self.children: dict[int, TrieNode] | None = None
        # target id -> sequence number of the latest insertion that recorded it here
        self.targets: dict[str, int] = {}
        # sequence number of the latest insertion through this node
        self.stamp = 0


class PrefixTrie:
    """A bounded trie of block-hash paths, each node labelled with its targets."""

    def __init__(self, max_nodes: int) -> None:
        if max_nodes < 1:
            raise ValueError("max_nodes must be at least 1")
        self.max_nodes = max_nodes
        self.root = TrieNode(0, None)
        self.root.children = {}
        self._size = 0
        self._seq = 0
        # One entry per touch, oldest first, as two parallel queues (node, stamp); an
        # entry whose stamp is no longer the node's (touched again since) or whose node
        # is detached is stale and skipped.  Cheaper per touch than an ordered map, and
        # no tuple per entry: fewer objects for the garbage collector to traverse.
        self._touch_nodes: deque[TrieNode] = deque()
        self._touch_stamps: deque[int] = deque()

    def __len__(self) -> int:
        return self._size

    def insert(self, hashes: Sequence[int], target: str) -> None:
        """Record that the prefix ``hashes`` was routed to ``target``."""
        if not hashes:
            return
        self._seq += 1
        seq, node, path = self._seq, self.root, []
        # A path longer than the bound would only evict its own tail.
        for h in hashes[: self.max_nodes]:
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(h)
            if child is None:
                child = children[h] = TrieNode(h, node)
                self._size += 1
            child.targets[target] = seq
            child.stamp = seq
            path.append(child)
            node = child
        # Deepest first, so a parent's latest touch always follows its children's.
        path.reverse()
        self._touch_nodes.extend(path)
        self._touch_stamps.extend(repeat(seq, len(path)))
        self._evict()

    def match(self, hashes: Sequence[int], available: Collection[str]) -> tuple[int, set[str]]:
        """Blocks of the longest prefix an available target served, and those targets."""
        node, depth = self.root, 0
        alive: Collection[str] = available  # narrowed to a set at the first matched node
        for h in hashes:
            child = node.children.get(h) if node.children else None
            if child is None:
                break
            # Same number of targets as the parent means the same targets (subset
            # invariant), so the available ones are unchanged: skip the intersection.
            if node is self.root or len(child.targets) != len(node.targets):
                deeper = child.targets.keys() & alive
                if not deeper:
                    break  # SkyLB's early stop: a child's targets are a subset of these
                alive = deeper
            node, depth = child, depth + 1
        return (depth, set(alive)) if depth else (0, set())

    def targets_at(self, hashes: Sequence[int]) -> dict[str, int]:
        """The targets (with insertion sequence) recorded at the node of ``hashes``."""
        node: TrieNode | None = self.root
        for h in hashes:
            node = node.children.get(h) if node and node.children else None
        return dict(node.targets) if node and node is not self.root else {}

    def retain_targets(self, target_ids: Iterable[str]) -> None:
        """Forget every target not in ``target_ids``; drop nodes left with no target."""
        keep = frozenset(target_ids)
        for node in self._live_nodes():
            for target in [t for t in node.targets if t not in keep]:
                del node.targets[target]
            if not node.targets:
                self._detach(node)

    def _live_nodes(self) -> list[TrieNode]:
        return [
            n
            for n, stamp in zip(self._touch_nodes, self._touch_stamps, strict=True)
            if n.stamp == stamp and n.parent is not None
        ]

    def _evict(self) -> None:
        nodes, stamps = self._touch_nodes, self._touch_stamps
        while self._size > self.max_nodes:
            node, stamp = nodes.popleft(), stamps.popleft()
            if node.stamp == stamp and node.parent is not None:
                self._detach(node)  # the oldest live node: always a leaf
        if len(nodes) > 2 * self.max_nodes + 1024:
            live = self._live_nodes()
            self._touch_nodes = deque(live)
            self._touch_stamps = deque(n.stamp for n in live)

    def _detach(self, node: TrieNode) -> None:
        parent = node.parent
        if parent is not None and parent.children and parent.children.get(node.key) is node:
            del parent.children[node.key]
        node.parent = None
        self._size -= 1
