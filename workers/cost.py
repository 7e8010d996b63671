"""What the fleet has cost over a window, and what it saved: one function the console
and ``GET /metrics/cost`` both call (``cost_summary``).

Replicas bill from ``launched_at`` (else ``created_at``) to ``terminated_at`` (else
now, while alive; a dead replica without ``terminated_at`` bills to its last state
change).  The arithmetic is ``workers.scaling.costing``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Q

from fleet.models import MetricRollup, Replica, ServiceConfig
from workers.scaling.costing import (
    BilledSpan,
    PeakProvisioning,
    on_demand_reference,
    overlap_us,
    peak_provisioning,
    savings,
    span,
    totals,
)

DEAD_STATES = (Replica.State.TERMINATED, Replica.State.PREEMPTED, Replica.State.FAILED)


@dataclass(frozen=True)
class CostSummary:
    window_start: datetime
    window_end: datetime
    total: Decimal
    by_kind: dict[str, Decimal]
    by_region: dict[str, Decimal]
    by_replica: dict[str, Decimal]
    on_demand_reference: Decimal
    savings_vs_on_demand: Decimal
    peak: PeakProvisioning
    regional_peak_cost: Decimal
    global_peak_cost: Decimal
    spans: list[BilledSpan] = field(repr=False, default_factory=list)


def _us(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def _end_of(replica: Replica, now: datetime) -> datetime:
    if replica.terminated_at is not None:
        return replica.terminated_at
    return replica.state_changed_at if replica.state in DEAD_STATES else now


def billed_spans(window_start: datetime, now: datetime) -> list[BilledSpan]:
    rows = Replica.objects.select_related("region").filter(
        Q(terminated_at__isnull=True) | Q(terminated_at__gt=window_start)
    )
    spans = []
    for r in rows:
        start = r.launched_at or r.created_at
        billed = overlap_us(_us(start), _us(_end_of(r, now)), _us(window_start), _us(now))
        if billed:
            spans.append(span(r.name, r.region.name, r.kind, Decimal(r.hourly_price), billed))
    return spans


def _region_qps(window_start: datetime, now: datetime) -> dict[object, dict[str, float]]:
    # One rollup pass writes every region with the same interval_end.
    by_interval: dict[object, dict[str, float]] = defaultdict(dict)
    rows = MetricRollup.objects.filter(
        scope=MetricRollup.Scope.REGION, interval_end__gt=window_start, interval_end__lte=now
    )
    for row in rows:
        seconds = (row.interval_end - row.interval_start).total_seconds()
        if seconds > 0:
            by_interval[row.interval_end][row.name] = row.requests / seconds
    return by_interval


def cost_summary(now: datetime, window_s: float | None = None) -> CostSummary:
    window = window_s if window_s is not None else settings.MERIDIAN_COST_WINDOW_S
    start = now - timedelta(seconds=window)
    spans = billed_spans(start, now)
    total = sum((s.cost for s in spans), Decimal(0))
    seconds = Decimal(_us(now) - _us(start)) / Decimal(1_000_000)
    od_price = Decimal(str(settings.MERIDIAN_CLOUD_ON_DEMAND_PRICE))
    services = list(ServiceConfig.objects.all())
    reference = sum(
        (
            on_demand_reference(s.target_replicas or s.min_replicas, od_price, seconds)
            for s in services
        ),
        Decimal(0),
    )
    q_tar = min((s.target_qps_per_replica for s in services), default=1.0)
    reserved = max((Decimal(s.reserved_hourly_price) for s in services), default=Decimal(0))
    peak = peak_provisioning(_region_qps(start, now), q_tar)
    return CostSummary(
        window_start=start,
        window_end=now,
        total=total,
        by_kind=totals(spans, "kind"),
        by_region=totals(spans, "region"),
        by_replica=totals(spans, "replica"),
        on_demand_reference=reference,
        savings_vs_on_demand=savings(total, reference),
        peak=peak,
        regional_peak_cost=Decimal(peak.regional_replicas) * reserved * seconds / 3600,
        global_peak_cost=Decimal(peak.global_replicas) * reserved * seconds / 3600,
        spans=spans,
    )
