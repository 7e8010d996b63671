"""What the fleet costs now, what it has cost, and what it saves against two baselines.

Pure arithmetic over plain rows (the Cost page gathers them), so every formula is
tested without a database.  Formulas, also shown in the page's tooltips:

* $/h now = Σ hourly_price of replicas that are billed (ready, starting, draining),
  by region and kind.
* Spend so far comes from the billing ledger (``workers.cost.cost_summary``):
  Σ hourly_price x seconds billed, from launch (cold start included, as clouds
  bill) to termination or now.
* Savings vs all on-demand = (N_billed x on-demand price - $/h now) / that, i.e.
  the same capacity bought at the on-demand rate (SkyServe's spot argument).
* Savings vs region-local peak (SkyLB §5's baseline) = each region provisions
  on-demand replicas for its own peak: ⌈peak req/s of the region / target req/s per
  replica⌉ x on-demand price, summed over regions, against $/h now.  Cross-region
  routing lets the global fleet follow the sum of the peaks' *envelope*, not the sum
  of every region's own peak.

The on-demand price is the highest ``on-demand`` hourly price seen in the fleet (the
price a region would pay without reservations or spot); with none, the highest price.
Engineer-facing note: the historical series uses today's fleet price, because fleet
history is not stored; a provider-side cost ledger replaces ``savings_series`` input.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

BILLED = frozenset({"ready", "starting", "draining"})


@dataclass(frozen=True)
class PricedReplica:
    region: str
    kind: str
    state: str
    hourly_price: float


@dataclass(frozen=True)
class RegionLoad:
    """A region's request rate in one rollup interval."""

    region: str
    end: datetime
    rps: float


@dataclass(frozen=True)
class CostSummary:
    hourly_by_region: dict[str, dict[str, float]]
    hourly_total: float
    spend_total: float
    on_demand_price: float
    all_on_demand_hourly: float
    region_peak_hourly: float
    peak_replicas: dict[str, int]

    @property
    def saving_vs_on_demand(self) -> float | None:
        return _saving(self.all_on_demand_hourly, self.hourly_total)

    @property
    def saving_vs_region_peak(self) -> float | None:
        return _saving(self.region_peak_hourly, self.hourly_total)


def _saving(baseline: float, actual: float) -> float | None:
    return (baseline - actual) / baseline if baseline > 0 else None


def on_demand_price(replicas: list[PricedReplica]) -> float:
    prices = [r.hourly_price for r in replicas if r.kind == "on-demand"]
    return max(prices or [r.hourly_price for r in replicas] or [0.0])


def hourly_by_region(replicas: list[PricedReplica]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in replicas:
        if r.state in BILLED:
            table[r.region][r.kind] += r.hourly_price
    return {region: dict(kinds) for region, kinds in sorted(table.items())}


def peak_replicas(loads: list[RegionLoad], target_rps: float) -> dict[str, int]:
    peaks: dict[str, float] = defaultdict(float)
    for load in loads:
        peaks[load.region] = max(peaks[load.region], load.rps)
    return {region: max(1, math.ceil(p / target_rps)) for region, p in sorted(peaks.items())}


def summarize(
    replicas: list[PricedReplica],
    loads: list[RegionLoad],
    *,
    target_rps: float,
    spend_total: float,
) -> CostSummary:
    by_region = hourly_by_region(replicas)
    price = on_demand_price(replicas)
    peaks = peak_replicas(loads, target_rps)
    billed = sum(1 for r in replicas if r.state in BILLED)
    return CostSummary(
        hourly_by_region=by_region,
        hourly_total=sum(sum(kinds.values()) for kinds in by_region.values()),
        spend_total=spend_total,
        on_demand_price=price,
        all_on_demand_hourly=billed * price,
        region_peak_hourly=sum(peaks.values()) * price,
        peak_replicas=peaks,
    )


def savings_series(
    loads: list[RegionLoad], *, hourly_now: float, price: float, target_rps: float
) -> tuple[list[str], list[float]]:
    """Cumulative $ saved against region-local peak provisioning, per rollup time:
    each region's running peak so far sets its baseline replicas."""
    running: dict[str, float] = {}
    times: list[str] = []
    saved: list[float] = []
    total, last = 0.0, None
    for load in sorted(loads, key=lambda x: x.end):
        running[load.region] = max(running.get(load.region, 0.0), load.rps)
        if last is not None and load.end > last:
            baseline = sum(max(1, math.ceil(p / target_rps)) for p in running.values()) * price
            total += (baseline - hourly_now) * (load.end - last).total_seconds() / 3600
            times.append(load.end.isoformat())
            saved.append(round(total, 4))
        last = load.end if last is None else max(last, load.end)
    return times, saved
