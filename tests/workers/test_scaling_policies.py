"""Placement policies and the autoscaler, pure: no database, no settings.

``ScriptedCloud`` (``tests.support.scripted_cloud``) is a cloud whose spot capacity
per zone the test sets by hand and whose replicas become ready when the test says
so, so each step of SkyServe's Figure 7 narrative can be staged exactly.
"""

from __future__ import annotations

import pytest

from tests.support.scripted_cloud import ZONES, ScriptedCloud
from workers.scaling.autoscaler import AutoscalerConfig, AutoscalerState, RequestRateAutoscaler
from workers.scaling.fleet import ON_DEMAND, SPOT, Fleet, FleetReplica, MixTarget
from workers.scaling.reconcile import reconcile
from workers.scaling.registry import build_policy
from workers.scaling.spothedge import SpotHedgePolicy


def spothedge(n_extra: int = 1) -> SpotHedgePolicy:
    policy = build_policy("spothedge", ZONES, n_extra=n_extra)
    assert isinstance(policy, SpotHedgePolicy)
    return policy


def step(policy: SpotHedgePolicy, cloud: ScriptedCloud, n_target: int = 3) -> None:
    reconcile(policy, n_target, cloud.fleet(), cloud, now=0.0)


def test_figure7_launch_failure_moves_zone_to_preempting_and_fallback_is_brief() -> None:
    # Figure 7: 4 spot replicas (N_tar=3, N_extra=1) over three zones; zone 2 refuses.
    policy, cloud = spothedge(), ScriptedCloud()
    cloud.capacity["zone2"] = 0
    step(policy, cloud)
    assert policy.preempting == ["zone2"]
    assert cloud.count(SPOT) == 4 and cloud.count(SPOT, "zone2") == 0
    assert cloud.count(ON_DEMAND) == 3  # nothing ready yet: O(t) = min(3, 4 - 0)

    cloud.make_ready(policy)
    step(policy, cloud)
    assert cloud.count(ON_DEMAND) == 0  # N_tar + N_extra spot ready: fallback ends
    assert {r.kind for r in cloud.terminated} == {ON_DEMAND}


def test_figure7_lost_zone_moves_replicas_and_on_demand_covers_the_cold_start() -> None:
    policy, cloud = spothedge(), ScriptedCloud()
    cloud.capacity["zone2"] = 0
    step(policy, cloud)
    cloud.make_ready(policy)
    step(policy, cloud)

    cloud.lose_zone("zone3", policy)
    step(policy, cloud)
    assert cloud.count(SPOT) == 4
    assert cloud.count(SPOT, "zone1") == 4  # "moves replicas to zone 1"
    lost = 4 - cloud.fleet().ready(SPOT)
    assert cloud.count(ON_DEMAND) == min(3, lost)

    cloud.make_ready(policy)
    step(policy, cloud)
    assert cloud.count(ON_DEMAND) == 0


def test_figure7_all_zones_lost_on_demand_carries_n_target() -> None:
    policy, cloud = spothedge(), ScriptedCloud()
    step(policy, cloud)
    cloud.make_ready(policy)
    step(policy, cloud)
    for zone in ("zone1", "zone2", "zone3"):
        cloud.lose_zone(zone, policy)
    step(policy, cloud)
    assert cloud.count(SPOT) == 0
    assert cloud.count(ON_DEMAND) == 3
    cloud.make_ready(policy)
    step(policy, cloud)
    assert cloud.fleet().ready(ON_DEMAND) == 3 and cloud.count(ON_DEMAND) == 3


def test_algorithm1_rebalances_when_fewer_than_two_zones_remain() -> None:
    policy = spothedge()
    policy.spot_preempted("zone1")
    assert policy.available == ["zone2", "zone3"] and policy.preempting == ["zone1"]
    policy.spot_preempted("zone2")
    assert sorted(policy.available) == ["zone1", "zone2", "zone3"] and policy.preempting == []


def test_algorithm1_prefers_unused_zones_then_lowest_cost() -> None:
    policy = spothedge()
    empty = Fleet(())
    assert policy.next_spot_zone(empty, frozenset()) == "zone1"
    one = Fleet((FleetReplica("a", SPOT, "zone1", True, 0.0),))
    assert policy.next_spot_zone(one, frozenset()) == "zone2"
    every = Fleet(tuple(FleetReplica(z.name, SPOT, z.name, True, 0.0) for z in ZONES))
    assert policy.next_spot_zone(every, frozenset()) == "zone1"
    policy.spot_ready("zone1")  # a ready replica in an available zone changes nothing
    policy.spot_preempted("zone1")
    policy.spot_ready("zone1")
    assert "zone1" in policy.available and policy.preempting == []


def test_spothedge_state_round_trips() -> None:
    policy = spothedge()
    policy.spot_preempted("zone3")
    again = build_policy("spothedge", ZONES, state=policy.snapshot())
    assert again.snapshot() == {"available": ["zone1", "zone2"], "preempting": ["zone3"]}


def test_even_spread_keeps_a_lost_slot_in_its_zone() -> None:
    policy = build_policy("even_spread", ZONES)
    cloud = ScriptedCloud(capacity={"zone1": 10, "zone2": 0, "zone3": 10})
    result = reconcile(policy, 3, cloud.fleet(), cloud, now=0.0)
    assert result.target == MixTarget(spot=3, on_demand=0)
    assert cloud.count(SPOT) == 2 and cloud.count(SPOT, "zone2") == 0
    assert result.refused == [(SPOT, "zone2")]


def test_round_robin_moves_on_to_the_next_zone() -> None:
    policy = build_policy("round_robin", ZONES)
    cloud = ScriptedCloud(capacity={"zone1": 10, "zone2": 0, "zone3": 10})
    reconcile(policy, 3, cloud.fleet(), cloud, now=0.0)
    assert cloud.count(SPOT) == 3
    assert cloud.count(SPOT, "zone1") == 2 and cloud.count(SPOT, "zone3") == 1


def test_static_mix_and_on_demand_only() -> None:
    assert build_policy("static_mix", ZONES, static_on_demand=1).mix(4, Fleet(())) == MixTarget(
        3, 1
    )
    assert build_policy("on_demand", ZONES).mix(4, Fleet(())) == MixTarget(0, 4)
    with pytest.raises(ValueError, match="unknown scaling policy"):
        build_policy("cheapest", ZONES)


def test_scale_down_takes_replicas_that_are_not_ready_first() -> None:
    policy = build_policy("on_demand", ZONES)
    fleet = Fleet(
        (
            FleetReplica("old-ready", ON_DEMAND, "zone1", True, 1.0),
            FleetReplica("new-ready", ON_DEMAND, "zone1", True, 2.0),
            FleetReplica("booting", ON_DEMAND, "zone1", False, 0.0),
        )
    )
    cloud = ScriptedCloud(live={r.handle: r for r in fleet.replicas})
    result = reconcile(policy, 1, fleet, cloud, now=3.0)
    assert result.terminated == ["booting", "new-ready"]


def autoscaler(**overrides: float) -> RequestRateAutoscaler:
    config = {"target_qps_per_replica": 2.0, "min_replicas": 1, "max_replicas": 5}
    config |= {"upscale_delay_s": 60.0, "downscale_delay_s": 300.0} | overrides
    return RequestRateAutoscaler(AutoscalerConfig(**config))  # type: ignore[arg-type]


def test_autoscaler_upscales_only_after_the_delay() -> None:
    scaler, state = autoscaler(), AutoscalerState(n_target=1)
    assert scaler.candidate(7.0) == 4  # ceil(7 / 2)
    state = scaler.step(state, 0.0, 7.0)
    assert state.n_target == 1 and state.above_since == 0.0
    state = scaler.step(state, 59.0, 7.0)
    assert state.n_target == 1
    state = scaler.step(state, 60.0, 7.0)
    assert state == AutoscalerState(n_target=4)


def test_autoscaler_forgets_a_burst_and_respects_bounds() -> None:
    scaler, state = autoscaler(), AutoscalerState(n_target=2)
    state = scaler.step(state, 0.0, 100.0)
    state = scaler.step(state, 30.0, 4.0)  # back to N_tar: the upscale clock resets
    assert state == AutoscalerState(n_target=2)
    state = scaler.step(scaler.step(state, 40.0, 100.0), 100.0, 100.0)
    assert state.n_target == 5  # max_replicas
    state = scaler.step(scaler.step(state, 200.0, 0.0), 500.0, 0.0)
    assert state.n_target == 1  # min_replicas, after the downscale delay


def test_autoscaler_state_survives_persistence() -> None:
    state = AutoscalerState(n_target=3, above_since=12.5)
    assert AutoscalerState.from_dict(state.to_dict(), 1) == state
    assert AutoscalerState.from_dict({"n_target": "x"}, 2) == AutoscalerState(n_target=2)
