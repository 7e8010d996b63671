"""Every pricing rule Meridian shows, in one place: the Cost page, ``GET /metrics/cost``
and the scaling simulator's reports all read their figures from ``summarize``.

Pure: plain dataclasses in, a ``CostSummary`` out; no ORM and no clock (the caller
passes ``now``).  Money is ``Decimal`` (prices are stored with four decimals) and time
is counted in whole microseconds, so the sums an operator reads add up exactly.

The rules:

- **Billing** (SkyServe §2.3): a replica costs ``hourly_price x seconds / 3600`` from
  its launch, cold start included, until it ends; spend over a window is the part of
  that life inside the window.  A replica is *billed now* when it has started and not
  ended, whatever its state (provisioning too: clouds bill it).
- **$/h now**: the hourly prices of the replicas billed now, by region and kind.
- **All on-demand** (SkyServe Figure 14b's reference): N_tar on-demand replicas over
  the window.  N_tar is the autoscaler's target for an autoscaled service, and the
  replicas billed now for one whose replicas an operator registered (that is the
  capacity the operator chose).  The on-demand price is the cheapest one the fleet
  paid in the window (where a policy buys on-demand: ``on_demand_zone``), else the
  configured price.  Saving = (reference - spend) / reference.
- **Region-local vs global peak** (SkyLB §2.2, Figure 3): each region reserving
  ⌈its own peak QPS / Q_tar⌉ replicas, versus ⌈peak of the *summed* QPS / Q_tar⌉ when
  reservations follow global demand and regions absorb each other's peaks.  Q_tar is
  the smallest target QPS per replica of any service (the strictest sizing).  Saving
  = (regional - global) / regional replicas, whatever the price; the dollar figures
  use the configured reserved price, else the cheapest reserved price in the window.
- **Savings over time**: the on-demand reference accrued so far minus spend so far,
  at every moment the billed rate changes, so the curve ends at the headline figure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TypeVar

Interval = TypeVar("Interval")
ON_DEMAND = "on-demand"
RESERVED = "reserved"
SECONDS_PER_HOUR = Decimal(3600)
MICROSECOND = timedelta(microseconds=1)
US_PER_SECOND = Decimal(1_000_000)


def seconds_between(start: datetime, end: datetime) -> Decimal:
    """Whole microseconds from ``start`` to ``end`` (0 if it ends first), in seconds."""
    return Decimal(max(0, (end - start) // MICROSECOND)) / US_PER_SECOND


@dataclass(frozen=True)
class BilledReplica:
    """One replica's billed life: from ``start`` to ``end`` (None while still billed)."""

    name: str
    region: str
    kind: str
    model: str
    hourly_price: Decimal
    start: datetime
    end: datetime | None = None

    def billed_at(self, moment: datetime) -> bool:
        return self.start <= moment and (self.end is None or moment < self.end)

    def seconds_in(self, window_start: datetime, window_end: datetime) -> Decimal:
        end = window_end if self.end is None else min(self.end, window_end)
        return seconds_between(max(self.start, window_start), end)

    def cost_in(self, window_start: datetime, window_end: datetime) -> Decimal:
        return self.hourly_price * self.seconds_in(window_start, window_end) / SECONDS_PER_HOUR


@dataclass(frozen=True)
class Service:
    """What the baselines need to know about one served model.

    ``target_replicas`` is the autoscaler's N_tar; None for a service whose replicas an
    operator registers.  The defaults are ServiceConfig's.
    """

    model: str
    target_replicas: int | None
    target_qps_per_replica: float = 2.0
    reserved_hourly_price: Decimal = Decimal(0)


@dataclass(frozen=True)
class RegionLoad:
    """A region's request rate over one rollup interval (one pass ends them together)."""

    interval_end: datetime
    region: str
    qps: float


@dataclass(frozen=True)
class PeakProvisioning:
    """SkyLB Figure 3: reserved replicas for region-local peaks versus the global peak."""

    by_region: dict[str, int]
    global_replicas: int

    @property
    def regional_replicas(self) -> int:
        return sum(self.by_region.values())

    @property
    def saving(self) -> Decimal | None:
        """Fraction of reservations the global peak saves (None without any demand)."""
        regional = self.regional_replicas
        return Decimal(regional - self.global_replicas) / regional if regional else None


@dataclass(frozen=True)
class CostSummary:
    window_start: datetime
    window_end: datetime
    # Spend inside the window.
    total: Decimal
    by_kind: dict[str, Decimal]
    by_region: dict[str, Decimal]
    by_replica: dict[str, Decimal]
    # $/h of the replicas billed at window_end: region -> kind -> $/h.
    hourly_by_region: dict[str, dict[str, Decimal]]
    hourly_total: Decimal
    # All on-demand.
    n_target: int
    on_demand_price: Decimal
    on_demand_reference: Decimal
    savings_vs_on_demand: Decimal | None
    # Region-local vs global peak.
    peak: PeakProvisioning
    reserved_price: Decimal
    regional_peak_cost: Decimal
    global_peak_cost: Decimal
    savings_series: list[tuple[datetime, Decimal]] = field(repr=False, default_factory=list)

    @property
    def window_seconds(self) -> Decimal:
        return seconds_between(self.window_start, self.window_end)

    @property
    def savings_vs_region_peak(self) -> Decimal | None:
        return self.peak.saving

    @property
    def cost_ratio(self) -> Decimal | None:
        """Spend relative to the all-on-demand reference (SkyServe Figure 14b's y axis)."""
        return self.total / self.on_demand_reference if self.on_demand_reference else None


def savings(actual: Decimal, reference: Decimal) -> Decimal | None:
    """Fraction saved against ``reference`` (None when there is nothing to compare to)."""
    return (reference - actual) / reference if reference else None


def totals(costs: Iterable[tuple[str, Decimal]]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for name, cost in costs:
        out[name] = out.get(name, Decimal(0)) + cost
    return out


def hourly_by_region(
    replicas: Iterable[BilledReplica], now: datetime
) -> dict[str, dict[str, Decimal]]:
    table: dict[str, dict[str, Decimal]] = defaultdict(dict)
    for r in replicas:
        if r.billed_at(now):
            table[r.region][r.kind] = table[r.region].get(r.kind, Decimal(0)) + r.hourly_price
    return {region: table[region] for region in sorted(table)}


def n_target(services: Iterable[Service], replicas: Sequence[BilledReplica], now: datetime) -> int:
    def replicas_of(s: Service) -> int:
        if s.target_replicas is not None:
            return s.target_replicas
        return sum(1 for r in replicas if r.model == s.model and r.billed_at(now))

    return sum(replicas_of(s) for s in services)


def cheapest_price(
    replicas: Iterable[BilledReplica], kind: str, window_start: datetime, now: datetime
) -> Decimal | None:
    """The lowest price paid for ``kind`` inside the window (None: none was billed)."""
    paid = [r.hourly_price for r in replicas if r.kind == kind and r.seconds_in(window_start, now)]
    return min(paid, default=None)


def on_demand_reference(n_target: int, on_demand_price: Decimal, seconds: Decimal) -> Decimal:
    """What ``n_target`` on-demand replicas cost over ``seconds``."""
    return Decimal(n_target) * on_demand_price * seconds / SECONDS_PER_HOUR


def peak_provisioning(
    qps_by_interval: Mapping[Interval, Mapping[str, float]], target_qps_per_replica: float
) -> PeakProvisioning:
    """``qps_by_interval``: interval key → region → QPS in that interval."""
    region_peak: dict[str, float] = {}
    global_peak = 0.0
    for by_region in qps_by_interval.values():
        for region, qps in by_region.items():
            region_peak[region] = max(region_peak.get(region, 0.0), qps)
        global_peak = max(global_peak, sum(by_region.values()))

    def replicas(qps: float) -> int:
        # The tolerance keeps float noise (2.0000000001 QPS) from reserving one more.
        return math.ceil(qps / target_qps_per_replica - 1e-9) if qps > 0 else 0

    return PeakProvisioning(
        by_region={region: replicas(q) for region, q in sorted(region_peak.items())},
        global_replicas=replicas(global_peak),
    )


def qps_by_interval(loads: Iterable[RegionLoad]) -> dict[datetime, dict[str, float]]:
    by_interval: dict[datetime, dict[str, float]] = defaultdict(dict)
    for load in loads:
        by_interval[load.interval_end][load.region] = load.qps
    return dict(by_interval)


def savings_over_time(
    replicas: Iterable[BilledReplica],
    *,
    window_start: datetime,
    now: datetime,
    reference_hourly: Decimal,
) -> list[tuple[datetime, Decimal]]:
    """Cumulative $ saved against ``reference_hourly`` at each change of the billed rate.

    Between two changes both rates are constant, so these points draw the exact curve.
    """
    changes: dict[datetime, Decimal] = defaultdict(Decimal)
    for r in replicas:
        start, end = max(r.start, window_start), now if r.end is None else min(r.end, now)
        if end > start:
            changes[start] += r.hourly_price
            changes[end] -= r.hourly_price
    points = [(window_start, Decimal(0))]
    rate = saved = Decimal(0)
    last = window_start
    for moment in sorted({*changes, now}):
        saved += (reference_hourly - rate) * seconds_between(last, moment) / SECONDS_PER_HOUR
        rate += changes.get(moment, Decimal(0))
        if moment > last:
            points.append((moment, saved))
        last = moment
    return points


def _peak(services: Sequence[Service], loads: Iterable[RegionLoad]) -> PeakProvisioning:
    if not services:
        return PeakProvisioning({}, 0)  # no service: nothing to reserve for
    q_tar = min(s.target_qps_per_replica for s in services)
    return peak_provisioning(qps_by_interval(loads), q_tar)


def _reserved_price(
    services: Sequence[Service], replicas: Sequence[BilledReplica], start: datetime, now: datetime
) -> Decimal:
    configured = max((s.reserved_hourly_price for s in services), default=Decimal(0))
    if configured:
        return configured
    return cheapest_price(replicas, RESERVED, start, now) or Decimal(0)


def summarize(
    replicas: Sequence[BilledReplica],
    services: Sequence[Service],
    loads: Iterable[RegionLoad],
    *,
    window_start: datetime,
    now: datetime,
    on_demand_price: Decimal,
) -> CostSummary:
    """Every figure over ``[window_start, now)``; ``on_demand_price`` is the configured
    price, used when the fleet paid for no on-demand replica in the window."""
    billed = [(r, r.cost_in(window_start, now)) for r in replicas]
    billed = [(r, c) for r, c in billed if r.seconds_in(window_start, now)]
    total = sum((c for _, c in billed), Decimal(0))
    seconds = seconds_between(window_start, now)
    n = n_target(services, replicas, now)
    paid = cheapest_price(replicas, ON_DEMAND, window_start, now)
    od_price = on_demand_price if paid is None else paid
    reference = on_demand_reference(n, od_price, seconds)
    peak, reserved = _peak(services, loads), _reserved_price(services, replicas, window_start, now)
    by_region = hourly_by_region(replicas, now)
    return CostSummary(
        window_start=window_start,
        window_end=now,
        total=total,
        by_kind=totals((r.kind, c) for r, c in billed),
        by_region=totals((r.region, c) for r, c in billed),
        by_replica=totals((r.name, c) for r, c in billed),
        hourly_by_region=by_region,
        hourly_total=sum((sum(k.values(), Decimal(0)) for k in by_region.values()), Decimal(0)),
        n_target=n,
        on_demand_price=od_price,
        on_demand_reference=reference,
        savings_vs_on_demand=savings(total, reference),
        peak=peak,
        reserved_price=reserved,
        regional_peak_cost=Decimal(peak.regional_replicas) * reserved * seconds / SECONDS_PER_HOUR,
        global_peak_cost=Decimal(peak.global_replicas) * reserved * seconds / SECONDS_PER_HOUR,
        savings_series=savings_over_time(
            replicas, window_start=window_start, now=now, reference_hourly=n * od_price
        ),
    )
