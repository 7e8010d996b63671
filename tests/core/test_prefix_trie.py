"""SkyLB's prefix trie: bounded, oldest insertions evicted first, longest available match."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.prefix_trie import PrefixTrie
from tests.support.descriptors import prefix

paths = st.lists(st.integers(0, 5), min_size=1, max_size=8)  # small alphabet: shared prefixes
inserts = st.lists(st.tuples(paths, st.sampled_from("abcd")), min_size=1, max_size=60)


def test_longest_match_among_available_targets() -> None:
    trie = PrefixTrie(max_nodes=100)
    system = prefix(1, 3)
    trie.insert(prefix(2, 4, system), "a")
    trie.insert(prefix(3, 2, system), "b")
    assert trie.match(prefix(2, 4, system), {"a", "b"}) == (7, {"a"})
    assert trie.match(prefix(3, 5, system), {"a", "b"}) == (5, {"b"})
    # "a" busy: the shared system prompt still matches on "b".
    assert trie.match(prefix(2, 4, system), {"b"}) == (3, {"b"})
    assert trie.match(prefix(9, 4), {"a", "b"}) == (0, set())
    assert trie.match(system, set()) == (0, set())


def test_targets_are_recorded_with_their_insertion_sequence() -> None:
    trie = PrefixTrie(max_nodes=10)
    trie.insert([1, 2], "a")
    trie.insert([1], "b")
    assert trie.targets_at([1]) == {"a": 1, "b": 2}
    assert trie.targets_at([1, 2]) == {"a": 1}
    assert trie.targets_at([7]) == {} and trie.targets_at([]) == {}


def test_oldest_insertions_are_evicted_first_and_reinsertion_refreshes() -> None:
    trie = PrefixTrie(max_nodes=6)
    trie.insert([1, 2], "a")  # oldest
    trie.insert([3, 4], "a")
    trie.insert([1, 2], "b")  # refreshes [1, 2]: now [3, 4] is the oldest
    trie.insert([5, 6, 7], "a")
    # Seven nodes for a bound of six: the oldest leaf, block 4 of [3, 4], went first.
    assert len(trie) == 6
    assert trie.match([3, 4], {"a"}) == (1, {"a"})
    assert trie.match([1, 2], {"a", "b"}) == (2, {"a", "b"})
    trie.insert([8], "c")
    assert trie.match([3], {"a"}) == (0, set())
    assert len(trie) == 6


def test_a_path_longer_than_the_bound_keeps_its_head() -> None:
    trie = PrefixTrie(max_nodes=4)
    trie.insert(list(range(10)), "a")
    assert len(trie) == 4
    assert trie.match(list(range(10)), {"a"}) == (4, {"a"})
    with pytest.raises(ValueError):
        PrefixTrie(0)


def test_retain_targets_drops_removed_targets_and_their_empty_nodes() -> None:
    trie = PrefixTrie(max_nodes=50)
    trie.insert([1, 2, 3], "a")
    trie.insert([1, 5], "b")
    trie.retain_targets(["b"])
    assert len(trie) == 2
    assert trie.match([1, 2, 3], {"a", "b"}) == (1, {"b"})


@settings(max_examples=80, deadline=None)
@given(inserts, st.integers(1, 12))
def test_size_stays_bounded_and_the_last_insert_is_matched(
    ops: list[tuple[list[int], str]], bound: int
) -> None:
    trie = PrefixTrie(max_nodes=bound)
    for path, who in ops:
        trie.insert(path, who)
        assert len(trie) <= bound
        depth, matched = trie.match(path, {who})
        # A served prefix is matched next time (up to the bound).
        assert depth == min(len(path), bound) and matched == {who}


@settings(max_examples=80, deadline=None)
@given(inserts, st.sets(st.sampled_from("abcd")), paths)
def test_match_returns_only_available_targets_that_really_served_the_prefix(
    ops: list[tuple[list[int], str]], available: set[str], probe: list[int]
) -> None:
    trie = PrefixTrie(max_nodes=1000)
    for path, who in ops:
        trie.insert(path, who)
    depth, matched = trie.match(probe, available)
    assert matched <= available
    served = {
        who: max((_common(path, probe) for path, w in ops if w == who), default=0)
        for who in available
    }
    best = max(served.values(), default=0)
    assert depth == best
    assert matched == ({w for w, d in served.items() if d == best} if best else set())


@settings(max_examples=80, deadline=None)
@given(st.lists(paths, min_size=1, max_size=30), st.integers(1, 10))
def test_eviction_removes_the_oldest_insertions_first(
    insert_paths: list[list[int]], bound: int
) -> None:
    """Against a model: every node's age is its latest insertion (deeper nodes of one
    insertion count as older), and the trie keeps exactly the ``bound`` newest nodes."""
    trie = PrefixTrie(max_nodes=bound)
    model: dict[tuple[int, ...], tuple[int, int]] = {}
    for seq, path in enumerate(insert_paths):
        trie.insert(path, "a")
        for depth in range(1, min(len(path), bound) + 1):
            model[tuple(path[:depth])] = (seq, -depth)
        while len(model) > bound:
            del model[min(model, key=model.__getitem__)]
    assert len(trie) == len(model)
    for node in model:
        assert trie.match(list(node), {"a"})[0] == len(node)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
