"""Demand-aware placement across regions: replicas where the forecast demand is.

SkyLB (§2.2) argues that regions serving each other's overflow need only reserve for
the *global* peak, not each region for its own.  This module sizes a window's fleet
per region from each region's forecast demand (requests/s) and asks how much of a
region's excess its neighbours may absorb:

* ``per_region``: each region holds ⌈its own demand / per-replica rate⌉ (no spill);
* ``demand_aware``: the fleet holds ⌈total demand / rate⌉ plus what the spill rules
  force, placed first where the demand is (largest remainder of each region's share),
  then a region whose deficit its neighbours cannot absorb gets one more replica, until
  none is left.  A region may forward at most ``max_spill`` of its demand, and only to
  regions within ``rtt_budget_ms`` that have spare capacity after their own demand
  (SkyLB forwards over the WAN only while the RTT is a small part of the TTFT budget).

``evaluate`` replays the actual demand against an allocation: what each region serves
locally, what it forwards (to the nearest neighbours with spare capacity first, within
the same two limits) and what is left unserved.  Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PlacementConfig:
    replica_rps: float  # what one replica serves within the SLO (already with headroom)
    max_spill: float = 0.3
    rtt_budget_ms: float = 100.0

    def __post_init__(self) -> None:
        if self.replica_rps <= 0:
            raise ValueError("replica_rps must be positive")
        if not 0 <= self.max_spill <= 1:
            raise ValueError("max_spill must lie in [0, 1]")


@dataclass(frozen=True)
class Served:
    local: float
    forwarded: float
    unserved: float


def neighbours(
    region: str, rtt_ms: Mapping[tuple[str, str], float], regions: Sequence[str], budget: float
) -> list[str]:
    """Regions within ``budget`` of ``region``, nearest first (ValueError: RTT unknown)."""
    found = []
    for other in regions:
        if other == region:
            continue
        rtt = rtt_ms.get((region, other), rtt_ms.get((other, region)))
        if rtt is None:
            raise ValueError(f"no RTT between {region} and {other}")
        if rtt <= budget:
            found.append((rtt, other))
    return [other for _, other in sorted(found)]


def per_region(demand: Mapping[str, float], config: PlacementConfig) -> dict[str, int]:
    return {r: math.ceil(max(0.0, d) / config.replica_rps - 1e-9) for r, d in demand.items()}


def demand_aware(
    demand: Mapping[str, float], rtt_ms: Mapping[tuple[str, str], float], config: PlacementConfig
) -> dict[str, int]:
    regions = sorted(demand)
    total = sum(max(0.0, d) for d in demand.values())
    n = math.ceil(total / config.replica_rps - 1e-9)
    if n == 0:
        return dict.fromkeys(regions, 0)
    shares = {r: max(0.0, demand[r]) / total * n for r in regions}
    counts = {r: math.floor(shares[r]) for r in regions}
    for r in sorted(regions, key=lambda r: shares[r] - counts[r], reverse=True)[
        : n - sum(counts.values())
    ]:
        counts[r] += 1
    # Each pass either finds every deficit absorbed or adds a replica: it ends within
    # per_region's count, where no region has a deficit.
    while (short := _first_unabsorbed(demand, counts, rtt_ms, config)) is not None:
        counts[short] += 1
    return counts


def _first_unabsorbed(
    demand: Mapping[str, float],
    counts: Mapping[str, int],
    rtt_ms: Mapping[tuple[str, str], float],
    config: PlacementConfig,
) -> str | None:
    for region, served in evaluate(demand, counts, rtt_ms, config).items():
        if served.unserved > 1e-9:
            return region
    return None


def evaluate(
    demand: Mapping[str, float],
    counts: Mapping[str, int],
    rtt_ms: Mapping[tuple[str, str], float],
    config: PlacementConfig,
) -> dict[str, Served]:
    """Actual demand against ``counts``: served locally, forwarded, unserved (req/s)."""
    regions = sorted(demand)
    capacity = {r: counts.get(r, 0) * config.replica_rps for r in regions}
    spare = {r: max(0.0, capacity[r] - max(0.0, demand[r])) for r in regions}
    result = {}
    # The largest deficits forward first: they have the fewest other options.
    deficits = {r: max(0.0, demand[r] - capacity[r]) for r in regions}
    for region in sorted(regions, key=lambda r: -deficits[r]):
        local = min(max(0.0, demand[region]), capacity[region])
        allowed = min(deficits[region], config.max_spill * max(0.0, demand[region]))
        forwarded = 0.0
        for other in neighbours(region, rtt_ms, regions, config.rtt_budget_ms):
            take = min(spare[other], allowed - forwarded)
            spare[other] -= take
            forwarded += take
        result[region] = Served(local, forwarded, deficits[region] - forwarded)
    return result


@dataclass(frozen=True)
class DayCost:
    strategy: str
    replica_hours: float
    served_share: float
    forwarded_share: float


def day_cost(
    strategy: str,
    allocations: Sequence[Mapping[str, int]],
    actual: Sequence[Mapping[str, float]],
    rtt_ms: Mapping[tuple[str, str], float],
    config: PlacementConfig,
    window_s: float,
) -> DayCost:
    """Replica-hours of a day's allocations, and the share of the actual demand served."""
    hours = sum(sum(a.values()) for a in allocations) * window_s / 3600
    total = served = forwarded = 0.0
    for counts, demand in zip(allocations, actual, strict=True):
        for s in evaluate(demand, counts, rtt_ms, config).values():
            total += s.local + s.forwarded + s.unserved
            served += s.local + s.forwarded
            forwarded += s.forwarded
    return DayCost(
        strategy,
        hours,
        served / total if total else 1.0,
        forwarded / total if total else 0.0,
    )
