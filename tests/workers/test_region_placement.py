"""Demand-aware placement across regions: pooling within the RTT and spill limits."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.support.workload_files import write_servegen
from workers.scaling.region_placement import (
    PlacementConfig,
    day_cost,
    demand_aware,
    evaluate,
    per_region,
)

RTT = {("us", "eu"): 75.0, ("us", "ap"): 150.0, ("eu", "ap"): 215.0}
CONFIG = PlacementConfig(replica_rps=1.0, max_spill=0.3, rtt_budget_ms=100.0)


def test_per_region_rounds_each_region_up() -> None:
    assert per_region({"us": 2.2, "eu": 2.2, "ap": 0.0}, CONFIG) == {"us": 3, "eu": 3, "ap": 0}


def test_near_regions_pool_their_remainders_and_far_ones_do_not() -> None:
    demand = {"us": 2.2, "eu": 2.2, "ap": 1.5}
    counts = demand_aware(demand, RTT, CONFIG)
    # us and eu (75 ms) share one replica's worth of remainders: 5 where per-region
    # holds 6; ap (150 ms and more away) keeps its own 2.
    assert counts["us"] + counts["eu"] == 5 and counts["ap"] == 2
    served = evaluate(demand, counts, RTT, CONFIG)
    assert all(s.unserved == pytest.approx(0.0) for s in served.values())
    assert sum(s.forwarded for s in served.values()) == pytest.approx(0.2)


def test_spill_beyond_its_share_is_unserved_and_forces_a_replica() -> None:
    demand = {"us": 4.0, "eu": 0.1, "ap": 0.1}
    served = evaluate(demand, {"us": 2, "eu": 3, "ap": 0}, RTT, CONFIG)
    # us may forward 30 % of 4.0 = 1.2 to eu, which has 2.9 spare: 0.8 is left unserved.
    assert served["us"].forwarded == pytest.approx(1.2)
    assert served["us"].unserved == pytest.approx(0.8)
    assert served["ap"].unserved == pytest.approx(0.1)  # nobody within 100 ms has room
    counts = demand_aware(demand, RTT, CONFIG)
    assert all(s.unserved == 0 for s in evaluate(demand, counts, RTT, CONFIG).values())
    assert counts["ap"] == 1


def test_day_cost_counts_replica_hours_and_the_served_share() -> None:
    plan = [{"us": 1, "eu": 1, "ap": 0}] * 6
    actual = [{"us": 1.0, "eu": 1.0, "ap": 0.5}] * 6
    cost = day_cost("x", plan, actual, RTT, CONFIG, 600.0)
    assert cost.replica_hours == pytest.approx(2.0)
    assert cost.served_share == pytest.approx(2.0 / 2.5)


def test_missing_rtt_and_bad_config_are_refused() -> None:
    with pytest.raises(ValueError, match="no RTT between"):
        evaluate({"us": 1.0, "sa": 1.0}, {"us": 0, "sa": 0}, RTT, CONFIG)
    with pytest.raises(ValueError, match="max_spill"):
        PlacementConfig(replica_rps=1.0, max_spill=2.0)


def test_bench_placement_prints_every_strategy(tmp_path: Path) -> None:
    folder = write_servegen(tmp_path / "m", windows=4 * 144)
    out = StringIO()
    call_command(
        "bench", "placement", "--servegen", str(folder), "--days", "2",
        "--regions", "us-east-1:0,eu-west-1:6", "--rtt", "us-east-1/eu-west-1=75",
        stdout=out,
    )  # fmt: skip
    lines = {line.split("  ")[0].strip(): line for line in out.getvalue().splitlines()}
    assert {"per-region peak", "per-region", "demand-aware", "demand-aware, oracle"} <= set(lines)
    assert "100.00%" in lines["demand-aware, oracle"]
