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
    with pytest.raises(CommandError, match=r"no spot data; expected \*\.json"):
        call_command("simulate_scaling", "--spot-trace", str(tmp_path))


def test_availability_logs_are_a_second_source_and_a_folder_is_merged(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    for name, zone in (("east-a.out", "us-east-1a"), ("east-b.out", "us-east-1b")):
        lines = [
            f"[2020-03-15T10:00:00.000Z] Created instance i-{zone} with 1 GPU(s)"
            f" of type v100 in zone {zone}",
            f"[2020-03-15T12:00:00.000Z] Instance i-{zone} running in zone {zone}",
        ]
        (folder / name).write_text("\n".join(lines) + "\n")
    text = run_command(
        "simulate_scaling",
        "--spot-trace",
        str(folder),
        "--policy",
        "spothedge,on_demand",
        "--n-target",
        "1",
        "--cold-start-s",
        "60",
    )
    lines = text.splitlines()
    assert lines[0].startswith("logs: merged 2 availability log(s)")
    assert "into one multi-zone timeline" in lines[0] and "us-east-1a, us-east-1b" in lines[0]
    rows = {line.split()[1]: line.split() for line in lines[3:]}
    assert rows["on_demand"][0] == "logs/v100x1" and rows["on_demand"][2:4] == ["100.0%", "1.000"]
    assert rows["spothedge"][2] == "100.0%"


def test_a_log_in_an_unexpected_format_names_the_expected_one(tmp_path: Path) -> None:
    (tmp_path / "odd.out").write_text("2020-03-15 10:00 instance up\n")
    with pytest.raises(CommandError, match=r"odd\.out:1: .* is not a spot availability event log"):
        call_command("simulate_scaling", "--spot-trace", str(tmp_path / "odd.out"))
