"""`bench sim`: the simulator's speed table (numbers are reported, never asserted)."""

from __future__ import annotations

import io

from ops.bench import sim


def test_the_table_reports_both_scales_with_their_costs() -> None:
    out = io.StringIO()
    options = {
        "duration": 20.0, "per_hour": 3600.0, "big_duration": 1.0, "big_rate": 1.0,
        "skip_big": False, "seed": 0,
    }  # fmt: skip
    sim.run(options, out)
    header, small, big = out.getvalue().splitlines()
    assert header.split()[:3] == ["scenario", "requests", "virtual"]
    assert small.startswith("9 replicas, 3 regions")
    assert big.startswith("1000 replicas, 10 regions")
    for row in (small, big):
        requests, _, wall, per_wall, events, per_event, steps, probes, rss = row.split()[-9:]
        assert int(requests) > 0 and int(events) > int(requests)
        assert float(wall) >= 0 and float(per_wall) > 0 and float(per_event) > 0
        assert int(steps) > 0 and int(probes) > 0 and float(rss) > 0


def test_the_nine_replica_scenario_is_the_demo_fleet_at_the_asked_load() -> None:
    ((label, config),) = sim.scenarios(
        {"duration": 3600.0, "per_hour": 12_000.0, "skip_big": True, "seed": 0}
    )
    assert label == "9 replicas, 3 regions"
    assert sum(config.replicas.values()) == 9
    assert sum(config.rate.values()) * 3600 == 12_000.0
