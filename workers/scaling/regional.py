"""Demand-aware placement in the live loop: a service's N split across regions.

The scaling policy decides how many replicas (N); this module decides how many of
them each region holds, from the forecast demand of each region
(``workers.forecasting`` stores one per region), the inter-region RTTs and the spill
SkyLB's forwarding may absorb.  It reuses the offline planner
(``workers.scaling.region_placement.demand_aware``) with demand measured in
replicas: region r's demand is ``N * share_r``, where ``share_r`` is its part of the
forecast tokens, and one replica serves one unit.  The planner places N by largest
remainder of the shares, then adds a replica to any region whose shortfall its
neighbours within the RTT budget cannot absorb within ``max_spill`` of its demand, so
the split may hold a few replicas more than N (``spill_extra``).  Where that would
pass the service's ``max_replicas`` the plain largest-remainder split of N is kept
and the decision says so (``capped``).

The placement policy then places each region's share within that region's zones
(``workers.scaling.controller``).  Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from workers.scaling.region_placement import PlacementConfig, demand_aware


@dataclass(frozen=True)
class RegionalConfig:
    max_spill: float = 0.3  # share of a region's demand its neighbours may serve
    rtt_budget_ms: float = 100.0  # farthest a region forwards to

    def __post_init__(self) -> None:
        if not 0 <= self.max_spill <= 1:
            raise ValueError("max_spill must lie in [0, 1]")
        if self.rtt_budget_ms < 0:
            raise ValueError("rtt_budget_ms must not be negative")


@dataclass(frozen=True)
class RegionalInputs:
    """What the glue read: each region's forecast demand (any unit, e.g. tokens per
    window) and the RTT of each pair of regions (a pair not given is out of reach)."""

    demand: Mapping[str, float]
    rtt_ms: Mapping[tuple[str, str], float] = field(default_factory=dict)
    config: RegionalConfig = field(default_factory=RegionalConfig)


@dataclass(frozen=True)
class RegionSplit:
    counts: dict[str, int]  # replicas each region holds (N_tar of its placement)
    shares: dict[str, float]  # each region's part of the forecast demand
    n_target: int  # the scaling policy's N
    spill_extra: int  # replicas above N that the spill limits forced
    capped: bool  # the extras would pass max_replicas: the plain split of N is kept

    @property
    def describe(self) -> str:
        parts = ", ".join(
            f"{r} {self.counts[r]} ({self.shares[r]:.0%})" for r in sorted(self.counts)
        )
        why = f"regions by forecast demand: {parts}"
        if self.spill_extra:
            why += f"; +{self.spill_extra} where neighbours cannot absorb the spill"
        if self.capped:
            why += "; spill limits not met within max_replicas"
        return why

    def as_data(self) -> dict[str, object]:
        return {
            "counts": dict(self.counts),
            "shares": {r: round(s, 4) for r, s in self.shares.items()},
            "n_target": self.n_target,
            "spill_extra": self.spill_extra,
            "capped": self.capped,
            "why": self.describe,
        }


def forecast_demand(forecast: Mapping[str, object], now_window: int) -> float | None:
    """A region's demand from its stored forecast entry: the largest prompt + decode
    tokens over the forecast windows not yet past (None: malformed, or all past)."""
    first, tokens = forecast.get("next_window"), forecast.get("forecast")
    if not isinstance(first, int) or not isinstance(tokens, Mapping):
        return None
    prompt, decode = tokens.get("prompt"), tokens.get("decode")
    if not isinstance(prompt, list) or not isinstance(decode, list):
        return None
    found = [
        max(0.0, float(p)) + max(0.0, float(d))
        for index, (p, d) in enumerate(zip(prompt, decode, strict=False), start=first)
        if index >= now_window and isinstance(p, int | float) and isinstance(d, int | float)
    ]
    return max(found) if found else None


def split_replicas(n_target: int, inputs: RegionalInputs, max_replicas: int) -> RegionSplit | None:
    """N across the regions of ``inputs.demand``; None (place N as one fleet) with
    fewer than two regions, no replicas or no demand anywhere."""
    regions = sorted(inputs.demand)
    if any(not math.isfinite(d) or d < 0 for d in inputs.demand.values()):
        raise ValueError(f"forecast demand must be finite and non-negative: {inputs.demand}")
    total = sum(inputs.demand.values())
    if len(regions) < 2 or n_target <= 0 or total <= 0:
        return None
    shares = {r: inputs.demand[r] / total for r in regions}
    units = {r: n_target * shares[r] for r in regions}
    c = inputs.config
    config = PlacementConfig(replica_rps=1.0, max_spill=c.max_spill, rtt_budget_ms=c.rtt_budget_ms)
    rtt = {
        (a, b): inputs.rtt_ms.get((a, b), inputs.rtt_ms.get((b, a), math.inf))
        for a in regions
        for b in regions
        if a < b
    }
    counts = demand_aware(units, rtt, config)
    capped = sum(counts.values()) > max(n_target, max_replicas)
    if capped:
        counts = largest_remainder(units, n_target)
    return RegionSplit(counts, shares, n_target, sum(counts.values()) - n_target, capped)


def largest_remainder(units: Mapping[str, float], n: int) -> dict[str, int]:
    """``n`` whole replicas in proportion to ``units`` (ties by region name)."""
    total = sum(units.values())
    shares = {r: units[r] / total * n for r in sorted(units)}
    counts = {r: math.floor(s) for r, s in shares.items()}
    rest = n - sum(counts.values())
    for r in sorted(shares, key=lambda r: (counts[r] - shares[r], r))[:rest]:
        counts[r] += 1
    return counts
