"""SGLang's approximate radix tree over block hashes: compressed edges, per-tenant LRU."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.radix_tree import RadixTree, common_prefix
from tests.support.descriptors import prefix

paths = st.lists(st.integers(0, 4), min_size=1, max_size=10)


def test_common_prefix_finds_the_divergence_point() -> None:
    edge = tuple(range(100))
    assert common_prefix(edge, tuple(range(100)), 0) == 100
    assert common_prefix(edge, (*range(37), -1, 5), 0) == 37
    assert common_prefix(edge, (9, 9, *range(10)), 2) == 10
    assert common_prefix(edge, (-1,), 0) == 0


def test_edges_split_where_prompts_diverge_and_sizes_count_blocks() -> None:
    tree = RadixTree(max_blocks_per_tenant=1000)
    system = prefix(1, 6)
    tree.insert(prefix(2, 4, system), "a")
    assert tree.node_count() == 1 and tree.size("a") == 10
    tree.insert(prefix(3, 2, system), "b")
    assert tree.node_count() == 3
    assert tree.size("a") == 10 and tree.size("b") == 8
    assert tree.match(prefix(2, 4, system), {"a", "b"}) == (10, {"a"})
    assert tree.match(prefix(2, 4, system), {"b"}) == (6, {"b"})
    assert tree.match(prefix(2, 2, system), {"a"}) == (8, {"a"})
    assert tree.match(prefix(9, 1), {"a"}) == (0, set())


def test_least_recently_inserted_leaves_go_first_per_tenant() -> None:
    tree = RadixTree(max_blocks_per_tenant=10, evict_fraction=0.0)
    system = prefix(1, 4)
    tree.insert(prefix(2, 3, system), "a")  # old tail
    tree.insert(prefix(3, 3, system), "a")  # newer tail
    tree.insert(prefix(9, 10), "b")  # another tenant's size does not count against a
    tree.insert(prefix(4, 3, system), "a")  # 13 blocks > 10: the oldest tail goes
    assert tree.size("a") == 10
    assert tree.match(prefix(2, 3, system), {"a"}) == (4, {"a"})
    assert tree.match(prefix(3, 3, system), {"a"})[0] == 7
    assert tree.size("b") == 10


def test_remove_tenant_drops_its_nodes_but_keeps_shared_ones() -> None:
    tree = RadixTree(max_blocks_per_tenant=100)
    system = prefix(1, 3)
    tree.insert(prefix(2, 2, system), "a")
    tree.insert(prefix(3, 2, system), "b")
    tree.retain_tenants(["b"])
    assert tree.tenants() == ["b"] and tree.size("a") == 0
    assert tree.match(prefix(2, 2, system), {"a", "b"}) == (3, {"b"})
    assert tree.node_count() == 2


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(paths, st.sampled_from("abc")), min_size=1, max_size=40))
def test_sizes_are_bounded_and_tenants_hold_whole_prefixes(
    ops: list[tuple[list[int], str]],
) -> None:
    bound = 12
    tree = RadixTree(max_blocks_per_tenant=bound, evict_fraction=0.25)
    for path, who in ops:
        tree.insert(path, who)
        assert tree.size(who) <= bound
        # The newest insertion is evicted last: only what exceeds the low-water mark goes.
        assert tree.match(path, {who})[0] >= min(len(path), tree.low_water)
    for who in tree.tenants():
        # Recount from the nodes: the tracked size is exact and every held node's
        # parent is held too (closure), which the match's early stop relies on.
        held = list(tree._nodes[who])
        assert sum(len(n.edge) for n in held) == tree.size(who)
        assert all(n.parent is tree.root or who in n.parent.tenants for n in held if n.parent)


def test_match_depths_gives_every_wanted_tenant_its_own_depth() -> None:
    tree = RadixTree(1000)
    doc = tuple(range(1, 11))
    tree.insert(doc, "deep")
    tree.insert(doc[:4], "shallow")
    tree.insert((*doc[:6], 99), "fork")
    depths = tree.match_depths((*doc, 50), {"deep", "shallow", "fork", "absent"})
    assert depths == {"deep": 10, "shallow": 4, "fork": 6}
    assert tree.match_depths(doc, {"shallow"}) == {"shallow": 4}
    assert tree.match_depths((7, 8), {"deep"}) == {}


def chained(path: list[int]) -> tuple[int, ...]:
    """``path`` as chained block hashes: each names its whole prefix, as the engines' do."""
    out: list[int] = []
    parent = 0
    for token in path:
        parent = hash((parent, token))
        out.append(parent)
    return tuple(out)


def test_release_cuts_the_tenant_from_the_evicted_block_down() -> None:
    tree = RadixTree(1000, index_blocks=True)
    system = prefix(1, 4)
    doc = prefix(2, 6, system)
    tree.insert(doc, "a")
    tree.insert(doc, "b")
    tree.insert(prefix(3, 2, system), "a")  # a second branch under the shared system prompt
    version = tree.version
    assert tree.release("a", [doc[6]]) == 4  # blocks 6..9 of the document
    assert tree.version > version
    assert tree.match(doc, {"a"}) == (6, {"a"})
    assert tree.match(doc, {"b"}) == (10, {"b"})  # another engine's copy is untouched
    assert tree.match(prefix(3, 2, system), {"a"})[0] == 6
    assert tree.size("a") == 8
    # Evicting the shared system prompt takes every branch below it with it.
    assert tree.release("a", [system[0]]) == 8
    assert tree.size("a") == 0 and tree.match(doc, {"a"}) == (0, set())
    # Blocks it no longer holds, or never did, are skipped.
    assert tree.release("a", [doc[8], 12345]) == 0


def test_release_of_the_last_holder_removes_the_nodes_and_their_index() -> None:
    tree = RadixTree(1000, index_blocks=True)
    doc = prefix(5, 8)
    tree.insert(doc, "a")
    tree.release("a", [doc[3]])
    assert tree.node_count() == 1
    # The cut blocks are gone from the index: a later copy elsewhere is found afresh.
    tree.insert(doc, "b")
    assert tree.release("b", [doc[5]]) == 3
    assert tree.match(doc, {"a", "b"}) == (5, {"b"})


def test_release_needs_the_block_index() -> None:
    tree = RadixTree(10)
    tree.insert(prefix(1, 2), "a")
    with pytest.raises(RuntimeError, match="index_blocks"):
        tree.release("a", [prefix(1, 2)[0]])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), paths, st.sampled_from("abc"), st.integers(0, 9)),
        min_size=1,
        max_size=40,
    )
)
def test_release_keeps_sizes_closure_and_the_index_true(
    ops: list[tuple[bool, list[int], str, int]],
) -> None:
    tree = RadixTree(max_blocks_per_tenant=12, evict_fraction=0.25, index_blocks=True)
    for evict, path, who, at in ops:
        seq = chained(path)
        if not evict:
            tree.insert(seq, who)
            continue
        block = seq[at % len(seq)]
        tree.release(who, [block])
        # Nothing through the evicted block is held by that tenant any more.
        assert tree.match(seq, {who})[0] <= seq.index(block)
    for who in tree.tenants():
        held = list(tree._nodes[who])
        assert sum(len(n.edge) for n in held) == tree.size(who)
        assert all(n.parent is tree.root or who in n.parent.tenants for n in held if n.parent)
    # The index finds every held block's node, and names no block the tree let go.
    attached = {n for nodes in tree._nodes.values() for n in nodes}
    assert all(tree._holder_of(h) is n for n in attached for h in n.edge)
    assert tree._where is not None
    assert {tree._holder_of(h) for h in tree._where} <= attached
