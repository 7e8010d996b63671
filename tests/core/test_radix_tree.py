"""SGLang's approximate radix tree over block hashes: compressed edges, per-tenant LRU."""

from __future__ import annotations

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
