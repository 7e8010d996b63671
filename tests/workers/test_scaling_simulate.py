"""Virtual-time simulation and trace reading, on tiny traces the tests write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from workers.scaling.fleet import ZoneOffer
from workers.scaling.prices import load_aws_spot_prices
from workers.scaling.registry import build_policy
from workers.scaling.simulate import SimConfig, VirtualCloud, _step, simulate
from workers.scaling.traces import UNBOUNDED, PoissonSpotModel, SpotTrace, load_traces


def write_trace(folder: Path, zone: str, values: list[int], gap: int = 60) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{zone}_v100_1.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": values}))
    return path


@pytest.fixture
def flaky_trace(tmp_path: Path) -> Path:
    """Three zones over 10 hours: zone a flaps hourly, b drops out for 3 hours, c is solid."""
    folder = tmp_path / "aws-test"
    hour = 60
    write_trace(folder, "us-test-1a", ([1] * 20 + [0] * 40) * 10)
    write_trace(folder, "us-test-1b", [1] * 4 * hour + [0] * 3 * hour + [1] * 3 * hour)
    write_trace(folder, "us-test-1c", [1] * 10 * hour)
    return folder


def offers(zones: list[str]) -> list[ZoneOffer]:
    return [ZoneOffer(z, "us-test-1", spot_price=0.9, on_demand_price=3.0) for z in zones]


def test_folder_is_one_trace_per_instance_with_binary_capacity(flaky_trace: Path) -> None:
    (trace,) = load_traces(flaky_trace)
    assert trace.name == "aws-test/v100_1" and trace.binary and trace.gap_s == 60
    assert sorted(trace.zones) == ["us-test-1a", "us-test-1b", "us-test-1c"]
    assert trace.capacity("us-test-1a", 0) == UNBOUNDED  # 1 = obtainable
    assert trace.capacity("us-test-1a", 21 * 60) == 0
    assert trace.duration_s == 600 * 60


def test_multi_node_values_are_capacities(tmp_path: Path) -> None:
    (trace,) = load_traces(write_trace(tmp_path, "us-x-1a", [4, 2, 0], gap=300))
    assert not trace.binary
    assert [trace.capacity("us-x-1a", t) for t in (0, 300, 900)] == [4, 2, 0]


def test_spothedge_beats_the_baselines_on_availability(flaky_trace: Path) -> None:
    (trace,) = load_traces(flaky_trace)
    config = SimConfig(n_target=2, n_extra=1, cold_start_s=120)
    zones = offers(sorted(trace.zones))
    results = {
        p: simulate(trace, p, zones, config) for p in ("spothedge", "even_spread", "round_robin")
    }
    assert results["spothedge"].availability >= 0.99
    assert results["even_spread"].availability < results["spothedge"].availability
    assert results["round_robin"].availability < results["spothedge"].availability
    assert results["spothedge"].relative_cost < 1.0
    assert results["even_spread"].preemptions > 0


def test_on_demand_costs_exactly_the_reference(flaky_trace: Path) -> None:
    (trace,) = load_traces(flaky_trace)
    result = simulate(trace, "on_demand", offers(sorted(trace.zones)), SimConfig(n_target=3))
    assert result.availability == 1.0
    assert result.cost == pytest.approx(3 * 3.0 * 10)  # 3 replicas x $3/h x 10 h
    assert result.relative_cost == pytest.approx(1.0)


def test_all_spot_with_steady_capacity_costs_the_spot_ratio(tmp_path: Path) -> None:
    (trace,) = load_traces(write_trace(tmp_path / "t", "us-s-1a", [1] * 120))
    result = simulate(trace, "round_robin", offers(["us-s-1a"]), SimConfig(n_target=2))
    assert result.relative_cost == pytest.approx(0.9 / 3.0)
    assert result.preemptions == 0


def test_poisson_model_is_deterministic_and_preempts() -> None:
    model = PoissonSpotModel({"z1": 2.0, "z2": 0.0}, mean_outage_s=600, seed=7)
    a, b = model.render(duration_s=24 * 3600), model.render(duration_s=24 * 3600)
    assert a.zones == b.zones
    assert 0 in a.zones["z1"] and set(a.zones["z2"]) == {1}


def test_spot_prices_are_per_zone_means(tmp_path: Path) -> None:
    rows = [
        {"AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge", "SpotPrice": "1.0"},
        {"AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge", "SpotPrice": "2.0"},
        {"AvailabilityZone": "us-east-1b", "InstanceType": "p2.xlarge", "SpotPrice": "0.3"},
    ]
    (tmp_path / "p3.json").write_text(json.dumps({"SpotPriceHistory": rows}))
    (tmp_path / "empty.json").write_text("")
    assert load_aws_spot_prices(tmp_path, "p3.2xlarge") == {"us-east-1a": 1.5}


def test_a_preemption_warning_drains_at_once_and_launches_the_replacement_early() -> None:
    # Zone a loses its spot capacity at 600 s; the cloud warns 120 s ahead.
    trace = SpotTrace("t", 60.0, {"z-a": [1] * 10 + [0] * 20, "z-b": [1] * 30}, binary=True)
    zones = [ZoneOffer(z, "r", spot_price=0.9, on_demand_price=3.0) for z in ("z-a", "z-b")]
    policy = build_policy("spothedge", zones, n_extra=0)
    cloud = VirtualCloud(trace, {z.name: z for z in zones}, cold_start_s=60.0)
    launched: dict[float, list[str]] = {}
    for step in range(0, 12):
        cloud.now = step * 60.0
        before = set(cloud.instances)
        _step(cloud, policy, 1, warning_s=120.0)
        launched[cloud.now] = sorted(cloud.instances[h].zone for h in set(cloud.instances) - before)
    in_a = [i for i in cloud.instances.values() if i.kind == "spot" and i.zone == "z-a"]
    assert [(i.warned_until, i.ended_at) for i in in_a] == [(600.0, 600.0)]
    # Warned at 480 s: out of the fleet at once, and its replacement launched then (in
    # the other zone), not after the loss; the loss itself is one preemption.
    assert "z-b" in launched[480.0]
    assert all(r.zone != "z-a" for r in cloud.fleet().replicas if r.kind == "spot")
    assert cloud.preemptions == 1
    with pytest.raises(CommandError, match="preemption-warning-s must be >= 0"):
        call_command("simulate_scaling", "--spot-trace", "x", "--preemption-warning-s", "-1")
