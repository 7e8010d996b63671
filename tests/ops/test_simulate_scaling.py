"""``manage.py simulate_scaling`` on a trace the test writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from ops.management.commands.simulate_scaling import Pricing, run_simulation
from tests.support.commands import run_command
from workers.scaling.simulate import SimConfig


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "aws-demo"
    folder.mkdir()
    series = {"us-demo-1a": [1, 1, 0, 0, 1, 1] * 40, "us-demo-1b": [1] * 240}
    for zone, values in series.items():
        doc = {"metadata": {"gap_seconds": 300}, "data": values}
        (folder / f"{zone}_v100_1.json").write_text(json.dumps(doc))
    return folder


def test_prints_availability_and_relative_cost_per_policy(trace_dir: Path) -> None:
    text = run_command(
        "simulate_scaling",
        "--spot-trace",
        f"{trace_dir},{trace_dir / 'us-demo-1b_v100_1.json'}",
        "--policy",
        "spothedge,even_spread,on_demand",
        "--n-target",
        "2",
    )
    lines = text.splitlines()
    assert lines[0].split() == ["trace", "policy", "availability", "cost/od", "preempt", "launches"]
    rows = {(line.split()[0], line.split()[1]): line.split() for line in lines[2:]}
    assert set(rows) == {
        (trace, policy)
        for trace in ("aws-demo/v100_1", "us-demo-1b_v100_1")
        for policy in ("spothedge", "even_spread", "on_demand")
    }
    assert rows[("aws-demo/v100_1", "on_demand")][2:4] == ["100.0%", "1.000"]
    assert rows[("us-demo-1b_v100_1", "even_spread")][2:4] == ["100.0%", "0.300"]


def test_run_simulation_uses_per_zone_spot_prices(trace_dir: Path) -> None:
    pricing = Pricing(on_demand=3.0, spot_by_zone={"us-demo-1b": 0.6})
    (result,) = run_simulation(
        [str(trace_dir / "us-demo-1b_v100_1.json")], ["round_robin"], SimConfig(n_target=1), pricing
    )
    assert result.relative_cost == pytest.approx(0.2)


def test_refuses_unknown_policies_and_missing_traces(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="unknown policy"):
        call_command("simulate_scaling", "--spot-trace", str(tmp_path), "--policy", "cheapest")
    with pytest.raises(CommandError, match=r"no \*\.json spot traces"):
        call_command("simulate_scaling", "--spot-trace", str(tmp_path))
