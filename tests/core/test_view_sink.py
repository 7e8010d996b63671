"""A policy's KV-event sink with the map of confirmed blocks kept beside it."""

from __future__ import annotations

from core.policies.meridian import MeridianConfig, MeridianPolicy
from core.view_sink import ViewedSink, view_map


def followed_tree() -> tuple[MeridianPolicy, ViewedSink]:
    policy = MeridianPolicy(MeridianConfig(tree_from_kv_events=True))
    assert policy.kv_sink is not None
    return policy, ViewedSink(policy.kv_sink, view_map())


def test_both_hear_every_store_and_removal_in_order() -> None:
    policy, sink = followed_tree()
    policy.tree.insert((1, 2, 3), "a")
    sink.apply_stored("a", (1, 2, 3))
    assert sink.view.confirmed_prefix("a", (1, 2, 3)) == 3
    mark = sink.view.evictions.mark("a")
    sink.apply_removed("a", (3,))
    assert sink.view.confirmed_prefix("a", (1, 2, 3)) == 2
    assert policy.tree.match((1, 2, 3), {"a"}) == (2, {"a"})  # the tree cut its hold too
    assert sink.view.evictions.removed_since("a", (3,), mark)


def test_a_cleared_cache_empties_both() -> None:
    policy, sink = followed_tree()
    policy.tree.insert((1, 2), "a")
    sink.apply_stored("a", (1, 2))
    sink.clear("a")
    assert sink.view.confirmed_prefix("a", (1, 2)) == 0
    assert policy.tree.match((1, 2), {"a"}) == (0, set())


def test_the_view_speculates_nothing() -> None:
    view = view_map()
    view.speculate("a", (7, 8))
    assert view.confirmed_prefix("a", (7, 8)) == 0 and view.max_speculative == 0
