"""``simulate_scaling --demand``: proactive + reactive vs reactive, SpotHedge placing both.

For each spot trace and each simulated day of a ServeGen model (``--days``), the days
before it are the forecaster's history; ``workers.scaling.demand_sim`` runs the day
under each scaling policy.  The table has one row per trace, day and policy and a
total per policy over the days: SLO attainment, P99 TTFT normalised by prompt length,
cost, replica-hours; and the change of ``preserve`` against ``request-rate`` (PreServe
reports -41 % P99 normalised latency and -49 % resources).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from workers.scaling.demand_sim import DemandConfig, DemandResult, scale_day, simulate_demand
from workers.scaling.fleet import ZoneOffer
from workers.scaling.traces import SpotTrace
from workers.scaling.workload_traces import servegen_requests

DAY_WINDOWS = 144


def parse_days(value: str) -> list[int]:
    """``"7-13"`` or ``"7,9"``: day numbers of the trace (day 0 is its first)."""
    try:
        if "-" in value:
            first, last = (int(v) for v in value.split("-", 1))
            return list(range(first, last + 1))
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--days {value!r}: expected FIRST-LAST or D,D,...") from None


def run_demand(
    folder: Path,
    days: Sequence[int],
    traces: Sequence[tuple[SpotTrace, list[ZoneOffer]]],
    scalers: Sequence[str],
    config: DemandConfig,
) -> list[tuple[str, int, DemandResult]]:
    requests = servegen_requests(folder)
    have = len(requests) // DAY_WINDOWS
    if not days or min(days) < 2 or max(days) >= have:
        raise ValueError(
            f"--days: each day needs two days before it; {folder} has days 0-{have - 1}"
        )
    results = []
    for trace, zones in traces:
        for d in days:
            history = requests[: d * DAY_WINDOWS]
            day = requests[d * DAY_WINDOWS : (d + 1) * DAY_WINDOWS]
            h, today = scale_day(history, day, config.peak_rps, config.window_s)
            for name in scalers:
                results.append(
                    (trace.name, d, simulate_demand(trace, zones, h, today, name, config))
                )
    return results


def format_demand(results: list[tuple[str, int, DemandResult]]) -> str:
    header = (
        f"{'trace':<28} {'day':>4} {'scaler':<13} {'SLO met':>8} {'p99 TTFT':>9}"
        f" {'p99 ms/tok':>10} {'cost $':>8} {'rep-h':>7} {'spot':>5} {'peak N':>6}"
    )
    rows = [header, "-" * len(header)]
    for trace, day, r in results:
        rows.append(
            f"{trace:<28} {day:>4} {r.scaler:<13} {r.slo_attainment:>8.2%} {r.p99_ttft_s:>8.1f}s"
            f" {r.p99_normalized_ms_per_token:>10.2f} {r.cost:>8.2f} {r.replica_hours:>7.1f}"
            f" {r.spot_share:>5.0%} {r.peak_replicas:>6}"
        )
    rows.append("")
    totals: dict[tuple[str, str], list[DemandResult]] = {}
    for trace, _, r in results:
        totals.setdefault((trace, r.scaler), []).append(r)
    summary = {key: _total(runs) for key, runs in totals.items()}
    for (trace, name), (met, p99, cost, hours) in summary.items():
        rows.append(
            f"{trace:<28} all days {name:<13} SLO met {met:.2%}  median daily p99"
            f" {p99:.2f} ms/token  cost ${cost:.2f}  {hours:.1f} replica-h"
        )
        base = summary.get((trace, "request-rate"))
        if name != "request-rate" and base is not None:
            rows.append(
                f"{'':<28} {name} vs request-rate: p99 {p99 / base[1] - 1:+.0%},"
                f" replica-h {hours / base[3] - 1:+.1%}, cost {cost / base[2] - 1:+.1%},"
                f" SLO met {100 * (met - base[0]):+.2f} points"
            )
    return "\n".join(rows)


def _total(runs: list[DemandResult]) -> tuple[float, float, float, float]:
    """SLO attainment over all requests, the median daily P99, cost, replica-hours."""
    requests = sum(r.requests for r in runs)
    met = sum(r.slo_attainment * r.requests for r in runs) / requests
    p99 = sorted(r.p99_normalized_ms_per_token for r in runs)[len(runs) // 2]
    return met, p99, sum(r.cost for r in runs), sum(r.replica_hours for r in runs)
