"""Demand-aware placement in the scaling step, pure: the regional split of N and each
region's share placed by the service's policy within its own zones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.scripted_cloud import ScriptedCloud
from workers.scaling.autoscaler import AutoscalerConfig
from workers.scaling.controller import Preemption, ServiceStep, ServiceView, step_service
from workers.scaling.fleet import ON_DEMAND, SPOT, ZoneOffer
from workers.scaling.region_placement import PlacementConfig, evaluate
from workers.scaling.regional import (
    RegionalConfig,
    RegionalInputs,
    forecast_demand,
    largest_remainder,
    split_replicas,
)

ZONES = [
    ZoneOffer("us-1a", "us", 1.0, 3.0),
    ZoneOffer("us-1b", "us", 1.1, 3.0),
    ZoneOffer("eu-1a", "eu", 1.2, 3.0),
    ZoneOffer("eu-1b", "eu", 1.3, 3.0),
]
VIEW = ServiceView(
    model_name="m",
    policy="spothedge",
    autoscaler=AutoscalerConfig(target_qps_per_replica=1.0, min_replicas=4, max_replicas=10),
    spot_extra=1,
    static_on_demand=0,
    target_replicas=None,
    scaling_state={},
)
NEAR = {("us", "eu"): 40.0}


def cloud() -> ScriptedCloud:
    return ScriptedCloud(capacity={z.name: 10 for z in ZONES})


def beat(
    view: ServiceView,
    c: ScriptedCloud,
    regional: RegionalInputs | None,
    *,
    now: float = 0.0,
    preemptions: tuple[Preemption, ...] = (),
) -> tuple[ServiceStep, ServiceView]:
    step = step_service(
        view,
        c.fleet(),
        ZONES,
        qps=0.0,
        now=now,
        preemptions=preemptions,
        launcher=c,
        regional=regional,
    )
    stored = replace(view, target_replicas=step.decision.n_target, scaling_state=step.scaling_state)
    return step, stored


def in_region(c: ScriptedCloud, kind: str, region: str) -> int:
    return sum(c.count(kind, z.name) for z in ZONES if z.region == region)


def test_the_split_follows_the_forecast_demand() -> None:
    split = split_replicas(8, RegionalInputs({"us": 300.0, "eu": 100.0}, NEAR), 10)
    assert split is not None
    assert split.counts == {"eu": 2, "us": 6} and split.spill_extra == 0 and not split.capped
    assert split.shares == {"eu": 0.25, "us": 0.75}
    flipped = split_replicas(8, RegionalInputs({"us": 100.0, "eu": 300.0}, NEAR), 10)
    assert flipped is not None and flipped.counts == {"eu": 6, "us": 2}
    assert "eu 6 (75%)" in flipped.describe


def test_a_shortfall_beyond_the_spill_limit_gets_one_more_replica() -> None:
    # 3 replicas for an even demand: largest remainder gives eu 2, us 1; us is short
    # 0.5 replica, 33 % of its demand of 1.5, over a 30 % spill limit.
    demand = {"us": 1.0, "eu": 1.0}
    tight = split_replicas(3, RegionalInputs(demand, NEAR, RegionalConfig(max_spill=0.3)), 10)
    assert tight is not None
    assert tight.counts == {"eu": 2, "us": 2} and tight.spill_extra == 1
    assert "+1 where neighbours cannot absorb" in tight.describe
    # The split meets the spill limit: replayed against the demand, nothing is unserved.
    units = {r: 1.5 for r in demand}
    served = evaluate(units, tight.counts, NEAR, PlacementConfig(1.0, 0.3, 100.0))
    assert all(s.unserved < 1e-9 for s in served.values())
    # A looser limit lets eu's spare replica absorb us's shortfall: N is kept.
    loose = split_replicas(3, RegionalInputs(demand, NEAR, RegionalConfig(max_spill=0.5)), 10)
    assert loose is not None and loose.counts == {"eu": 2, "us": 1} and loose.spill_extra == 0
    # Beyond the RTT budget (or with no RTT known) nothing spills.
    far = RegionalInputs(demand, {("us", "eu"): 150.0}, RegionalConfig(max_spill=0.5))
    unknown = RegionalInputs(demand, {}, RegionalConfig(max_spill=0.5))
    for inputs in (far, unknown):
        found = split_replicas(3, inputs, 10)
        assert found is not None and found.counts == {"eu": 2, "us": 2}


def test_max_replicas_keeps_the_plain_split_of_n_and_says_so() -> None:
    split = split_replicas(3, RegionalInputs({"us": 1.0, "eu": 1.0}, NEAR), 3)
    assert split is not None
    assert split.counts == {"eu": 2, "us": 1} and split.capped and split.spill_extra == 0
    assert "spill limits not met within max_replicas" in split.describe


def test_no_split_for_one_region_no_replicas_or_no_demand() -> None:
    assert split_replicas(4, RegionalInputs({"us": 5.0}), 10) is None
    assert split_replicas(0, RegionalInputs({"us": 5.0, "eu": 1.0}), 10) is None
    assert split_replicas(4, RegionalInputs({"us": 0.0, "eu": 0.0}), 10) is None


def test_bad_demand_and_config_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        split_replicas(4, RegionalInputs({"us": -1.0, "eu": 1.0}), 10)
    with pytest.raises(ValueError, match="max_spill"):
        RegionalConfig(max_spill=1.5)
    with pytest.raises(ValueError, match="rtt_budget_ms"):
        RegionalConfig(rtt_budget_ms=-1.0)


def test_largest_remainder_places_exactly_n() -> None:
    assert largest_remainder({"a": 1.0, "b": 1.0, "c": 1.0}, 4) == {"a": 2, "b": 1, "c": 1}
    assert largest_remainder({"a": 0.05, "b": 0.95}, 5) == {"a": 0, "b": 5}


def test_forecast_demand_reads_the_windows_not_yet_past() -> None:
    entry = {"next_window": 10, "forecast": {"prompt": [100.0, 300.0], "decode": [10.0, 20.0]}}
    assert forecast_demand(entry, 10) == 320.0  # the larger of the two windows
    assert forecast_demand(entry, 11) == 320.0
    assert forecast_demand(entry, 12) is None  # both past: a stale forecast
    assert forecast_demand({"next_window": "10", "forecast": {}}, 10) is None


def test_each_region_holds_its_share_placed_by_the_policy_in_its_own_zones() -> None:
    c = cloud()
    step, view = beat(VIEW, c, RegionalInputs({"us": 300.0, "eu": 100.0}, NEAR))
    assert step.decision.n_target == 4
    assert step.decision.regions["counts"] == {"eu": 1, "us": 3}
    # SpotHedge per region; the over-provisioning (spot_extra 1) once, in us.
    assert in_region(c, SPOT, "us") == 4 and in_region(c, SPOT, "eu") == 1
    # Algorithm 1 within us: each unused zone first, then the cheapest; never eu's zones.
    assert c.count(SPOT, "us-1a") == 3 and c.count(SPOT, "us-1b") == 1
    assert in_region(c, ON_DEMAND, "us") == 3 and in_region(c, ON_DEMAND, "eu") == 1
    assert step.target.spot == 5 and step.target.on_demand == 4
    assert set(step.scaling_state["placement_by_region"]) == {"eu", "us"}  # type: ignore[arg-type]
    assert step.changed

    # A preemption in eu moves eu's zone in eu's policy state only.
    c.make_ready()
    (lost,) = c.lose_zone("eu-1a")
    step, view = beat(view, c, view_inputs(), now=10.0, preemptions=(pm(lost.zone),))
    by_region = step.scaling_state["placement_by_region"]
    assert isinstance(by_region, dict)
    assert by_region["us"] == {"available": ["us-1a", "us-1b"], "preempting": []}
    # Two zones: one preempting leaves fewer than two available, so eu rebalances.
    assert by_region["eu"] == {"available": ["eu-1b", "eu-1a"], "preempting": []}
    assert c.count(SPOT, "eu-1b") == 1  # the replacement went to eu's other zone

    # Demand moves to eu: the split follows and us scales down.
    step, view = beat(view, c, RegionalInputs({"us": 100.0, "eu": 300.0}, NEAR), now=20.0)
    assert step.decision.regions["counts"] == {"eu": 3, "us": 1}
    assert in_region(c, SPOT, "eu") == 4 and in_region(c, SPOT, "us") == 1


def view_inputs() -> RegionalInputs:
    return RegionalInputs({"us": 300.0, "eu": 100.0}, NEAR)


def pm(zone: str) -> Preemption:
    return Preemption("m", SPOT, zone)


def test_without_per_region_forecasts_the_step_is_unchanged() -> None:
    plain, split_less = cloud(), cloud()
    a, _ = beat(VIEW, plain, None)
    # A region with zones but no forecast: no split either.
    b, _ = beat(VIEW, split_less, RegionalInputs({"us": 300.0}, NEAR))
    assert a.decision.launched == b.decision.launched
    assert a.scaling_state == b.scaling_state and a.decision.regions == b.decision.regions == {}
    assert "placement_by_region" not in a.scaling_state
    # One fleet over all four zones: SpotHedge spreads N + 1 spot over unused zones.
    assert sorted(c.split("@")[1] for c in a.decision.launched if c.startswith(SPOT)) == sorted(
        ["us-1a", "us-1b", "eu-1a", "eu-1b", "us-1a"]
    )
