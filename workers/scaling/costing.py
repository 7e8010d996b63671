"""Cost arithmetic: per-second billing and the two baselines Meridian is judged against.

Money is ``Decimal`` (prices are stored with four decimals) and time is whole
microseconds, so the sums an operator reads add up exactly.

- Billing (SkyServe §2.3): a replica costs ``hourly_price * seconds / 3600`` from its
  launch — cold start included — until it ends or the window closes.
- All on-demand at the same N_tar (SkyServe Figure 14b's reference).
- Region-local peak provisioning (SkyLB §2.2, Figure 3): each region reserves
  ⌈its own peak QPS / Q_tar⌉ replicas, versus ⌈peak of the *summed* QPS / Q_tar⌉
  when reservations follow global demand and regions absorb each other's peaks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

SECONDS_PER_HOUR = Decimal(3600)


@dataclass(frozen=True)
class BilledSpan:
    """The part of one replica's life that falls inside the accounting window."""

    replica: str
    region: str
    kind: str
    hourly_price: Decimal
    seconds: Decimal

    @property
    def cost(self) -> Decimal:
        return self.hourly_price * self.seconds / SECONDS_PER_HOUR


def overlap_us(start_us: int, end_us: int, window_start_us: int, window_end_us: int) -> int:
    """Microseconds of [start, end) inside [window_start, window_end)."""
    return max(0, min(end_us, window_end_us) - max(start_us, window_start_us))


def span(replica: str, region: str, kind: str, hourly_price: Decimal, billed_us: int) -> BilledSpan:
    return BilledSpan(replica, region, kind, hourly_price, Decimal(billed_us) / Decimal(1_000_000))


def totals(spans: Sequence[BilledSpan], key: str) -> dict[str, Decimal]:
    """Cost summed by a BilledSpan attribute (``region``, ``kind`` or ``replica``)."""
    out: dict[str, Decimal] = {}
    for s in spans:
        name = str(getattr(s, key))
        out[name] = out.get(name, Decimal(0)) + s.cost
    return out


def on_demand_reference(n_target: int, on_demand_price: Decimal, seconds: Decimal) -> Decimal:
    """What ``n_target`` on-demand replicas would have cost over the window."""
    return Decimal(n_target) * on_demand_price * seconds / SECONDS_PER_HOUR


def savings(actual: Decimal, reference: Decimal) -> Decimal:
    """Fraction saved against ``reference`` (0 when there is no reference)."""
    return (reference - actual) / reference if reference else Decimal(0)


@dataclass(frozen=True)
class PeakProvisioning:
    """SkyLB Figure 3: reserved replicas for region-local peaks versus the global peak."""

    regional_replicas: int
    global_replicas: int


def peak_provisioning(
    qps_by_interval: Mapping[object, Mapping[str, float]], target_qps_per_replica: float
) -> PeakProvisioning:
    """``qps_by_interval``: interval key → region → QPS in that interval."""
    region_peak: dict[str, float] = {}
    global_peak = 0.0
    for by_region in qps_by_interval.values():
        for region, qps in by_region.items():
            region_peak[region] = max(region_peak.get(region, 0.0), qps)
        global_peak = max(global_peak, sum(by_region.values()))

    def replicas(qps: float) -> int:
        return math.ceil(qps / target_qps_per_replica - 1e-9) if qps > 0 else 0

    return PeakProvisioning(
        regional_replicas=sum(replicas(q) for q in region_peak.values()),
        global_replicas=replicas(global_peak),
    )
