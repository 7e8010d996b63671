"""Push-based routing: sticky least-loaded among holders, speculative insert on a miss."""

from __future__ import annotations

from core.policies.cache_map import CacheMapConfig, CacheMapPolicy
from tests.core.test_cache_map import FakeClock
from tests.support.descriptors import prefix, request, target


def test_longest_held_prefix_wins_and_holders_share_by_load() -> None:
    policy = CacheMapPolicy(clock=FakeClock())
    a, b, c = target("a", outstanding=2), target("b", outstanding=1), target("c")
    doc = prefix(1, 6)
    policy.cache_map.apply_stored("a", doc)
    policy.cache_map.apply_stored("b", doc[:3])
    assert policy.select(request(doc), [a, b, c]) is a
    # Both hold the first three blocks of this one: the less loaded holder.
    assert policy.select(request(prefix(2, 3, doc[:3])), [a, b, c]) is b


def test_a_miss_goes_least_loaded_and_the_burst_follows_speculatively() -> None:
    clock = FakeClock()
    policy = CacheMapPolicy(CacheMapConfig(speculative_ttl_s=2.0), clock=clock)
    a, b = target("a"), target("b", outstanding=1)
    doc = prefix(1, 4)
    assert policy.select(request(doc), [a, b]) is a
    a.outstanding = 3
    assert policy.select(request(doc), [a, b]) is a  # no BlockStored yet: speculation
    assert policy.cache_map.is_speculative("a", doc[0])
    clock.now = 2.5  # never confirmed: the speculation expired
    assert policy.select(request(doc), [a, b]) is b


def test_a_failed_request_withdraws_its_speculation() -> None:
    policy = CacheMapPolicy(clock=FakeClock())
    a, b = target("a"), target("b", outstanding=1)
    doc = prefix(1, 4)
    chosen = policy.select(request(doc), [a, b])
    assert chosen is a
    policy.on_complete(request(doc), a, ok=False)
    assert policy.cache_map.holders(doc[0]) == set()


def test_speculation_is_capped_per_request_and_departed_replicas_are_cleared() -> None:
    policy = CacheMapPolicy(CacheMapConfig(max_speculative_blocks=2), clock=FakeClock())
    doc = prefix(1, 5)
    policy.select(request(doc), [target("a")])
    assert policy.cache_map.blocks_of("a") == list(doc[:2])
    policy.on_targets_changed(["b"])
    assert policy.cache_map.replicas() == []
