"""The registry builds every policy by name, refuses bad names and parameters, and every
policy honours the interface contract the balancer relies on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.policy import PolicyBase, least_loaded, load_key
from core.registry import (
    UnknownPolicyError,
    build_policy,
    policy_defaults,
    policy_names,
    remote_policy_name,
)
from tests.support.descriptors import prefix, request, target, targets

ALL = [
    "cache_map",
    "consistent_hash",
    "least_load",
    "meridian",
    "metrics_aware",
    "nearest",
    "power_of_two",
    "round_robin",
    "sglang",
    "skylb",
    "skylb_ch",
]


def test_every_policy_from_the_papers_is_registered() -> None:
    assert policy_names() == ALL
    for name in ALL:
        policy = build_policy(name)
        assert policy.name == name
        assert isinstance(policy, PolicyBase)


def test_only_the_policies_that_follow_the_engines_take_kv_events() -> None:
    # Both drivers (the simulator and the live consumer) subscribe a service's replicas
    # only where its policy names a sink (``Policy.kv_sink``).
    sinks = {name: build_policy(name).kv_sink for name in ALL}
    cache_map = build_policy("cache_map")
    assert cache_map.kv_sink is cache_map.cache_map  # type: ignore[attr-defined]
    assert [name for name, sink in sinks.items() if sink is not None] == ["cache_map"]
    assert build_policy("meridian", {"tree_from_kv_events": True}).kv_sink is not None


def test_remote_layer_reuses_skylb_structures_and_defaults_to_nearest() -> None:
    assert remote_policy_name("skylb") == "skylb"
    assert remote_policy_name("skylb_ch") == "skylb_ch"
    for name in ("least_load", "round_robin", "sglang", "cache_map", "consistent_hash"):
        assert remote_policy_name(name) == "nearest"


def test_unknown_names_and_parameters_are_refused_with_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError, match="choose one of"):
        build_policy("random")
    with pytest.raises(UnknownPolicyError, match="known: max_nodes, min_match_ratio"):
        build_policy("skylb", {"max_node": 5})


def test_mistyped_and_out_of_range_parameters_are_refused() -> None:
    with pytest.raises(UnknownPolicyError, match="must be int, got str"):
        build_policy("skylb", {"max_nodes": "100"})
    with pytest.raises(UnknownPolicyError, match="must be int, got bool"):
        build_policy("power_of_two", {"seed": True})
    with pytest.raises(UnknownPolicyError, match="cache_threshold"):
        build_policy("sglang", {"cache_threshold": 1.5})
    with pytest.raises(UnknownPolicyError, match="key must be one of"):
        build_policy("skylb_ch", {"key": "user"})


def test_parameters_reach_the_config_and_an_int_may_stand_for_a_float() -> None:
    policy = build_policy("sglang", {"cache_threshold": 1, "balance_abs_threshold": 4})
    assert policy.config.cache_threshold == 1.0  # type: ignore[attr-defined]
    assert policy_defaults("skylb_ch") == {"vnodes": 128, "key": "session", "prefix_blocks": 8}


@pytest.mark.parametrize("name", ALL)
def test_no_policy_picks_outside_the_candidates_or_from_none(name: str) -> None:
    policy = build_policy(name)
    known = targets(6)
    policy.on_targets_changed([t.target_id for t in known])
    assert policy.select(request(prefix(1, 4), session="s"), []) is None
    for i in range(30):
        # Route a few requests to every target so stateful policies learn the prefixes,
        # then offer only a subset: the learned favourites are out of reach.
        subset = known[i % 3 :: 2]
        chosen = policy.select(request(prefix(i % 4, 6), session=f"s{i % 4}"), subset)
        assert chosen is not None and chosen in subset
        policy.on_complete(request(), chosen, ok=i % 5 != 0)


def test_least_loaded_orders_by_outstanding_then_probe_then_id() -> None:
    a = target("a", outstanding=2)
    b = target("b", outstanding=1, waiting=3)
    c = target("c", outstanding=1, waiting=1, running=9)
    d = target("d", outstanding=1, waiting=1, running=9)
    assert least_loaded([a, b, c, d]) is c
    assert sorted([a, b, c, d], key=load_key) == [c, d, b, a]
    assert least_loaded([]) is None


STATEFUL = ["cache_map", "consistent_hash", "sglang", "skylb", "skylb_ch"]


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(STATEFUL),
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 12), st.sets(st.integers(0, 5), min_size=1)),
        min_size=1,
        max_size=25,
    ),
)
def test_stateful_policies_only_ever_choose_an_available_target(
    name: str, steps: list[tuple[int, int, set[int]]]
) -> None:
    """Whatever they learned, a learned favourite that is not a candidate is never chosen."""
    policy = build_policy(name)
    pool = targets(6)
    policy.on_targets_changed([t.target_id for t in pool])
    for tag, length, available in steps:
        subset = [pool[i] for i in sorted(available)]
        chosen = policy.select(request(prefix(tag, length), session=f"s{tag}"), subset)
        assert chosen is not None and any(chosen is t for t in subset)
