"""SkyLB policy: longest available prefix wins, insert at decision time, fall back to load."""

from __future__ import annotations

from core.policies.skylb import SkyLBConfig, SkyLBPolicy
from tests.support.descriptors import prefix, request, target, targets


def test_a_burst_sharing_a_new_prefix_follows_the_first_request() -> None:
    policy = SkyLBPolicy()
    pool = targets(4)
    system = prefix(1, 8)
    first = policy.select(request(prefix(2, 2, system)), pool)
    assert first is not None
    # Inserted at decision time: the next one follows even though nothing completed
    # and the first target is now the busiest.
    first.outstanding = 5
    assert policy.select(request(prefix(3, 2, system)), pool) is first


def test_unavailable_holder_is_skipped_for_the_next_longest_match() -> None:
    policy = SkyLBPolicy()
    a, b, c = target("a"), target("b"), target("c", outstanding=9)
    system = prefix(1, 4)
    policy.select(request(prefix(2, 4, system)), [a])
    policy.select(request(prefix(3, 1, system)), [b])
    assert policy.select(request(prefix(2, 4, system)), [a, b, c]) is a
    assert policy.select(request(prefix(2, 4, system)), [b, c]) is b
    # No match at all: least loaded.
    assert policy.select(request(prefix(7, 3)), [c, target("d", outstanding=1)]).target_id == "d"  # type: ignore[union-attr]


def test_equally_deep_holders_are_split_by_load() -> None:
    policy = SkyLBPolicy()
    a, b = target("a", outstanding=4), target("b", outstanding=1)
    doc = prefix(5, 6)
    policy.select(request(doc), [a])
    policy.select(request(doc), [b])
    assert policy.select(request(doc), [a, b]) is b


def test_min_match_ratio_explores_when_the_hit_is_short() -> None:
    policy = SkyLBPolicy(SkyLBConfig(min_match_ratio=0.5))
    holder, idle = target("holder", outstanding=3), target("idle")
    system = prefix(1, 2)
    policy.select(request(prefix(2, 2, system)), [holder])
    # 2 of 10 blocks matched: below half, so the idle replica is explored.
    assert policy.select(request(prefix(3, 8, system)), [holder, idle]) is idle
    # 4 of 5 matched: stick.
    assert policy.select(request(prefix(2, 3, system)), [holder, idle]) is holder


def test_removed_targets_are_forgotten_and_the_trie_is_bounded() -> None:
    policy = SkyLBPolicy(SkyLBConfig(max_nodes=50))
    pool = targets(3)
    for i in range(40):
        policy.select(request(prefix(i, 5)), pool)
    assert len(policy.trie) == 50
    policy.on_targets_changed(["r0"])
    assert all(set(policy.trie.targets_at(prefix(i, 1))) <= {"r0"} for i in range(40))
