"""Consistent hashing on the session key, and SkyLB-CH's availability skip and prefix key."""

from __future__ import annotations

from core.policies.consistent_hash import ConsistentHashPolicy
from core.policies.skylb_ch import SkyLBCHConfig, SkyLBCHPolicy
from tests.support.descriptors import prefix, request, target, targets


def test_a_session_stays_on_one_target_and_sessions_spread() -> None:
    policy = ConsistentHashPolicy()
    pool = targets(4)
    policy.on_targets_changed([t.target_id for t in pool])
    first = {s: policy.select(request(session=f"user-{s}"), pool) for s in range(40)}
    again = {s: policy.select(request(session=f"user-{s}"), pool) for s in range(40)}
    assert first == again
    assert len({t.target_id for t in first.values() if t}) == 4


def test_without_a_session_key_the_least_loaded_target_is_used() -> None:
    pool = [target("a", outstanding=5), target("b", outstanding=1)]
    assert ConsistentHashPolicy().select(request(prefix(1, 3)), pool) is pool[1]


def test_a_busy_owner_sheds_to_its_ring_successor_and_gets_the_session_back() -> None:
    policy = SkyLBCHPolicy()
    pool = targets(5)
    policy.on_targets_changed([t.target_id for t in pool])
    owner = policy.select(request(session="alice"), pool)
    assert owner is not None
    others = [t for t in pool if t is not owner]
    successor = policy.select(request(session="alice"), others)
    assert successor is not None and successor is not owner
    # The successor is stable while the owner is busy, and the owner returns after.
    assert policy.select(request(session="alice"), others) is successor
    assert policy.select(request(session="alice"), pool) is owner


def test_targets_never_announced_are_added_on_sight() -> None:
    policy = SkyLBCHPolicy()
    pool = targets(3)
    chosen = policy.select(request(session="bob"), pool)
    assert chosen in pool
    assert policy.ring.targets == {"r0", "r1", "r2"}


def test_removing_a_target_remaps_only_its_sessions() -> None:
    policy = ConsistentHashPolicy()
    pool = targets(5)
    policy.on_targets_changed([t.target_id for t in pool])
    before = {s: policy.select(request(session=f"u{s}"), pool) for s in range(200)}
    policy.on_targets_changed([t.target_id for t in pool[:4]])
    after = {s: policy.select(request(session=f"u{s}"), pool[:4]) for s in range(200)}
    assert all(after[s] is before[s] for s in before if before[s] is not pool[4])


def test_prefix_key_groups_requests_sharing_their_first_blocks() -> None:
    policy = SkyLBCHPolicy(SkyLBCHConfig(key="prefix", prefix_blocks=4))
    pool = targets(8)
    system = prefix(7, 4)
    shared = [request(prefix(100 + i, 5, system), session=f"u{i}") for i in range(30)]
    picks = [policy.select(r, pool) for r in shared]
    assert len({t.target_id for t in picks if t}) == 1
    # Session mode uses the session key and falls back to the prefix without one.
    by_session = SkyLBCHPolicy(SkyLBCHConfig(prefix_blocks=4))
    assert by_session.select(request(system), pool) is policy.select(request(system), pool)
    busy, idle = target("x", outstanding=1), target("y")
    assert by_session.select(request(), [busy, idle]) is idle
