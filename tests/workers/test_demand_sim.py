"""A day of demand under request-rate vs preserve scaling, SpotHedge placing both."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.support.workload_files import write_servegen
from workers.scaling.demand_sim import DemandConfig, scale_day, simulate_demand
from workers.scaling.fleet import ZoneOffer
from workers.scaling.traces import SpotTrace

DAY = 144


def ramp_day(index: int) -> float:
    """Requests per window: quiet nights, a sharp 08:00 ramp to a plateau, every day."""
    hour = (index % DAY) / 6
    return 600 * (2.0 if hour < 8 or hour >= 20 else 14.0)


def steady_spot(zones: list[str], days: int) -> SpotTrace:
    return SpotTrace("steady", 600.0, {z: [16] * (days * DAY + 1) for z in zones}, binary=False)


ZONES = [ZoneOffer(z, "us-east-1", 0.9, 3.0) for z in ("us-east-1a", "us-east-1b")]


def test_the_forecast_has_replicas_warm_for_a_ramp_the_reactive_scaler_chases() -> None:
    series = [ramp_day(i) for i in range(4 * DAY)]
    config = DemandConfig(peak_rps=14.0, replica_rps=2.0)
    history, day = scale_day(series[: 3 * DAY], series[3 * DAY :], config.peak_rps, 600.0)
    assert max(day) == pytest.approx(14.0) and min(day) == pytest.approx(2.0)
    trace = steady_spot([z.name for z in ZONES], 1)
    reactive = simulate_demand(trace, ZONES, history, day, "request-rate", config)
    proactive = simulate_demand(trace, ZONES, history, day, "preserve", config)
    assert reactive.requests == pytest.approx(proactive.requests)
    assert reactive.requests == pytest.approx(sum(day) * 600)
    # The ramp: reactive waits out its up-delay and the cold start with a growing backlog.
    assert reactive.slo_attainment < 0.99
    assert proactive.slo_attainment > reactive.slo_attainment
    assert proactive.p99_ttft_s < reactive.p99_ttft_s
    # Both pay for what they launched: 12 h at >= 9 replicas and 12 h at >= 2.
    for result in (reactive, proactive):
        assert result.replica_hours > 12 * 9 + 12 * 2
        assert result.spot_share > 0.9
        assert result.cost == pytest.approx(result.replica_hours * 0.9, rel=0.1)


def test_a_day_without_traffic_is_refused() -> None:
    with pytest.raises(ValueError, match="no traffic"):
        scale_day([1.0], [0.0, 0.0], 10.0, 600.0)
    with pytest.raises(ValueError, match="target_utilization"):
        DemandConfig(target_utilization=0.0)


def test_simulate_scaling_prints_both_policies_for_each_day(tmp_path: Path) -> None:
    folder = write_servegen(tmp_path / "m-tiny", windows=4 * DAY)
    spot = tmp_path / "spot"
    spot.mkdir()
    for zone in ("us-east-1a", "us-east-1b"):
        values = [4] * (DAY * 2)
        (spot / f"{zone}_v100_1.json").write_text(
            json.dumps({"metadata": {"gap_seconds": 600}, "data": values})
        )
    out = StringIO()
    call_command(
        "simulate_scaling", "--spot-trace", str(spot), "--demand", str(folder),
        "--days", "2-3", "--peak-rps", "8", stdout=out,
    )  # fmt: skip
    text = out.getvalue()
    rows = [
        line for line in text.splitlines() if line.startswith("spot/") and "all days" not in line
    ]
    assert [line.split()[1:3] for line in rows] == [
        ["2", "request-rate"], ["2", "preserve"], ["3", "request-rate"], ["3", "preserve"],
    ]  # fmt: skip
    assert "all days request-rate" in text and "all days preserve" in text
    assert "preserve vs request-rate: p99" in text
