"""Stateless policies: round robin, least load, power of two choices, nearest peer."""

from __future__ import annotations

import math

from core.policies.nearest import NearestPolicy
from core.policies.power_of_two import PowerOfTwoConfig, PowerOfTwoPolicy
from core.policies.round_robin import RoundRobinPolicy
from core.registry import build_policy
from tests.support.descriptors import request, target, targets


def test_round_robin_cycles_in_id_order_across_candidate_changes() -> None:
    policy = RoundRobinPolicy()
    pool = [target("c"), target("a"), target("b")]
    picks = [policy.select(request(), pool) for _ in range(4)]
    assert [t.target_id for t in picks if t] == ["a", "b", "c", "a"]
    # A drained replica does not restart the cycle from the first id.
    assert policy.select(request(), pool[:2]) is not None


def test_least_load_picks_fewest_outstanding() -> None:
    policy = build_policy("least_load")
    pool = [target("a", outstanding=3), target("b", outstanding=1), target("c", outstanding=2)]
    assert policy.select(request(), pool) is pool[1]


def test_power_of_two_takes_the_less_loaded_of_its_two_samples() -> None:
    pool = [target("idle"), target("busy", outstanding=10)]
    policy = PowerOfTwoPolicy()
    assert all(policy.select(request(), pool) is pool[0] for _ in range(20))
    assert policy.select(request(), pool[1:]) is pool[1]


def test_power_of_two_is_deterministic_for_a_seed_and_spreads_load() -> None:
    pool = targets(8)
    runs = [PowerOfTwoPolicy(PowerOfTwoConfig(seed=7)) for _ in range(2)]
    picks = [[p.select(request(), pool) for _ in range(200)] for p in runs]
    assert picks[0] == picks[1]
    # Equal load: any two samples tie and the lower id wins, so the highest id never does.
    assert {t.target_id for t in picks[0] if t} == {f"r{i}" for i in range(7)}
    other = [PowerOfTwoPolicy(PowerOfTwoConfig(seed=8)).select(request(), pool) for _ in range(50)]
    assert other != picks[0][:50]


def test_nearest_prefers_lowest_rtt_then_fewest_outstanding_then_id() -> None:
    far = target("eu", extra={"rtt_ms": 80.0})
    near_busy = target("us", outstanding=3, extra={"rtt_ms": 10.0})
    near_idle = target("us2", outstanding=1, extra={"rtt_ms": 10.0})
    unknown = target("ap")
    policy = NearestPolicy()
    assert policy.select(request(), [far, near_busy, near_idle, unknown]) is near_idle
    assert policy.select(request(), [far, unknown]) is far
    assert policy.select(request(), [unknown, target("zz", extra={"rtt_ms": math.nan})]) is unknown
