"""``manage.py bench placement``: demand-aware placement across regions vs per-region peaks.

    manage.py bench placement --servegen $SERVEGEN/language/m-large --days 7-13 \\
        [--regions us-east-1:0,eu-west-1:6,ap-northeast-1:13] [--peak-rps 16]

Each region's demand is the ServeGen model's own series started ``shift`` hours later
(the same clients, a time zone away: real shapes, not a rotated copy), scaled so the
busiest region's peak window is ``--peak-rps``.  Per region, the workload forecaster is
fitted on the days before and forecasts each window two ahead (the larger of the
current and the next window sizes it, as in ``simulate_scaling --demand``).  Per day
(10-minute windows; replicas serve ``--replica-rps`` at ``--utilization``):

* ``per-region peak``: each region reserves its own peak all day (SkyLB §2.2's
  baseline: region-local reservation);
* ``per-region``: each region follows its own forecast, no spill;
* ``demand-aware``: the fleet follows the summed forecast, placed where the forecast
  demand is, with spill within ``--max-spill`` and ``--rtt-budget-ms``
  (``workers.scaling.region_placement``);
* ``per-region, oracle`` and ``demand-aware, oracle``: both on the actual demand, so
  their difference is what pooling across regions saves, forecast error aside.

The table gives replica-hours, cost relative to per-region peak, and the share of the
actual demand served (locally or forwarded within the limits): equal SLO means an equal
served share.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from ops.scaling_demand import parse_days
from workers.scaling.region_placement import (
    DayCost,
    PlacementConfig,
    day_cost,
    demand_aware,
    per_region,
)
from workers.scaling.workload_forecast import ForecasterConfig, fit
from workers.scaling.workload_traces import SERVEGEN_WINDOW_S, servegen_requests

DAY = 144
DEFAULT_RTT = "us-east-1/eu-west-1=75,us-east-1/ap-northeast-1=150,eu-west-1/ap-northeast-1=215"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servegen", required=True, help="ServeGen model folder")
    parser.add_argument("--days", default="7-12")
    parser.add_argument("--regions", default="us-east-1:0,eu-west-1:6,ap-northeast-1:13")
    parser.add_argument("--rtt", default=DEFAULT_RTT, help="a/b=ms,...")
    parser.add_argument("--peak-rps", type=float, default=16.0)
    parser.add_argument("--replica-rps", type=float, default=2.0)
    parser.add_argument("--utilization", type=float, default=0.7)
    parser.add_argument("--max-spill", type=float, default=0.3)
    parser.add_argument("--rtt-budget-ms", type=float, default=100.0)


def parse_regions(value: str) -> dict[str, int]:
    try:
        pairs = [item.split(":") for item in value.split(",") if item.strip()]
        return {name.strip(): int(hours) for name, hours in pairs}
    except ValueError:
        raise ValueError(f"--regions {value!r}: expected NAME:SHIFT_HOURS,...") from None


def parse_rtt(value: str) -> dict[tuple[str, str], float]:
    try:
        found = {}
        for item in value.split(","):
            pair, ms = item.split("=")
            a, b = pair.split("/")
            found[(a.strip(), b.strip())] = float(ms)
        return found
    except ValueError:
        raise ValueError(f"--rtt {value!r}: expected A/B=MS,...") from None


def region_series(requests: Sequence[float], shifts: Mapping[str, int]) -> dict[str, list[float]]:
    """Each region's requests per window, its series starting ``shift`` hours in."""
    longest = max(shifts.values()) * 6
    usable = len(requests) - longest
    return {r: list(requests[h * 6 : h * 6 + usable]) for r, h in shifts.items()}


def forecasts(history: Sequence[float], day: Sequence[float]) -> list[float]:
    """Per window of ``day``: the larger forecast of it and the next, made before it."""
    model = fit(history, 0, ForecasterConfig(periods=(DAY, 7 * DAY)))
    sized = []
    for value in day:
        sized.append(max(model.forecast(2)))
        model = model.observe(value)
    return sized


def run_day(
    series: Mapping[str, list[float]],
    d: int,
    rtt: Mapping[tuple[str, str], float],
    config: PlacementConfig,
    scale: float,
) -> list[DayCost]:
    regions = sorted(series)
    span = slice(d * DAY, (d + 1) * DAY)
    actual = [{r: series[r][i] * scale for r in regions} for i in range(d * DAY, (d + 1) * DAY)]
    predicted = {r: forecasts(series[r][: d * DAY], series[r][span]) for r in regions}
    guess = [{r: predicted[r][i] * scale for r in regions} for i in range(DAY)]
    peaks = {r: max(w[r] for w in actual) for r in regions}
    plans = {
        "per-region peak": [per_region(peaks, config)] * DAY,
        "per-region": [per_region(g, config) for g in guess],
        "demand-aware": [demand_aware(g, rtt, config) for g in guess],
        "per-region, oracle": [per_region(a, config) for a in actual],
        "demand-aware, oracle": [demand_aware(a, rtt, config) for a in actual],
    }
    return [
        day_cost(name, plan, actual, rtt, config, SERVEGEN_WINDOW_S) for name, plan in plans.items()
    ]


def run(options: dict[str, Any], stdout: TextIO) -> None:
    shifts = parse_regions(options["regions"])
    rtt = parse_rtt(options["rtt"])
    config = PlacementConfig(
        replica_rps=options["replica_rps"] * options["utilization"],
        max_spill=options["max_spill"],
        rtt_budget_ms=options["rtt_budget_ms"],
    )
    series = region_series(servegen_requests(Path(options["servegen"])), shifts)
    days = parse_days(options["days"])
    if not days or min(days) < 2 or (max(days) + 1) * DAY > min(len(s) for s in series.values()):
        raise ValueError("--days: each day needs two days before it and must lie in the trace")
    peak = max(max(s[d * DAY : (d + 1) * DAY]) for s in series.values() for d in days)
    scale = options["peak_rps"] / (peak / SERVEGEN_WINDOW_S) / SERVEGEN_WINDOW_S
    totals: dict[str, list[DayCost]] = {}
    for d in days:
        for cost in run_day(series, d, rtt, config, scale):
            totals.setdefault(cost.strategy, []).append(cost)
    stdout.write(format_totals(totals, len(days)) + "\n")


def format_totals(totals: Mapping[str, list[DayCost]], days: int) -> str:
    base = sum(c.replica_hours for c in totals["per-region peak"])
    header = f"{'strategy':<22} {'replica-h':>10} {'vs peak':>8} {'served':>8} {'forwarded':>9}"
    rows = [f"{days} day(s)", header, "-" * len(header)]
    for name, costs in totals.items():
        hours = sum(c.replica_hours for c in costs)
        served = sum(c.served_share for c in costs) / len(costs)
        forwarded = sum(c.forwarded_share for c in costs) / len(costs)
        rows.append(
            f"{name:<22} {hours:>10.1f} {hours / base if base else math.nan:>8.3f}"
            f" {served:>8.2%} {forwarded:>9.2%}"
        )
    return "\n".join(rows)
