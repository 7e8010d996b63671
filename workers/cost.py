"""Reads the fleet's rows into ``workers.costing``'s plain data and summarizes them:
the one function the Cost page and ``GET /metrics/cost`` both call (``cost_summary``).

Replicas bill from ``launched_at`` (else ``created_at``) to ``terminated_at`` (else
while alive; a dead replica without ``terminated_at`` bills to its last state change).
Every rule is in ``workers.costing``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Q

from fleet.models import MetricRollup, Replica, ServiceConfig
from workers.costing import (
    BilledReplica,
    CostSummary,
    RegionLoad,
    Service,
    hourly_by_region,
    summarize,
)

DEAD_STATES = (Replica.State.TERMINATED, Replica.State.PREEMPTED, Replica.State.FAILED)


def _end_of(replica: Replica) -> datetime | None:
    if replica.terminated_at is not None:
        return replica.terminated_at
    return replica.state_changed_at if replica.state in DEAD_STATES else None


def billed_replicas(window_start: datetime) -> list[BilledReplica]:
    rows = Replica.objects.select_related("region").filter(
        Q(terminated_at__isnull=True) | Q(terminated_at__gt=window_start)
    )
    return [
        BilledReplica(
            name=r.name,
            region=r.region.name,
            kind=r.kind,
            model=r.model_name,
            hourly_price=Decimal(r.hourly_price),
            start=r.launched_at or r.created_at,
            end=_end_of(r),
        )
        for r in rows
    ]


def hourly_cost_by_region(now: datetime) -> dict[str, Decimal]:
    """What each region is billed per hour right now: the overview's and the live feed's
    "cost now", by the same rule as the Cost page's rate table."""
    by_kind = hourly_by_region(billed_replicas(now), now)
    return {region: sum(kinds.values(), Decimal(0)) for region, kinds in by_kind.items()}


def _target_replicas(service: ServiceConfig) -> int | None:
    # The controller's N_tar: its last target, else min_replicas before its first step.
    # A service without a scaling policy has none: its registered replicas count.
    if service.target_replicas:
        return service.target_replicas
    autoscaled = service.scaling_policy != ServiceConfig.ScalingPolicy.NONE
    return service.min_replicas if autoscaled else None


def services() -> list[Service]:
    return [
        Service(
            model=s.model_name,
            target_replicas=_target_replicas(s),
            target_qps_per_replica=s.target_qps_per_replica,
            reserved_hourly_price=Decimal(s.reserved_hourly_price),
        )
        for s in ServiceConfig.objects.all()
    ]


def region_loads(window_start: datetime, now: datetime) -> list[RegionLoad]:
    rows = MetricRollup.objects.filter(
        scope=MetricRollup.Scope.REGION, interval_end__gt=window_start, interval_end__lte=now
    )
    return [
        RegionLoad(row.interval_end, row.name, row.requests / seconds)
        for row in rows
        if (seconds := (row.interval_end - row.interval_start).total_seconds()) > 0
    ]


def cost_summary(now: datetime, window_s: float | None = None) -> CostSummary:
    window = window_s if window_s is not None else settings.MERIDIAN_COST_WINDOW_S
    start = now - timedelta(seconds=window)
    return summarize(
        billed_replicas(start),
        services(),
        region_loads(start, now),
        window_start=start,
        now=now,
        on_demand_price=Decimal(str(settings.MERIDIAN_CLOUD_ON_DEMAND_PRICE)),
    )
