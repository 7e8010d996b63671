"""Cost page: $/hour now by region and kind, spend so far, savings against all
on-demand and region-local peak provisioning, and savings over time
(``console.cost_view`` holds every formula)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from console.cost_view import PricedReplica, RegionLoad, savings_series, summarize
from fleet.models import MetricRollup, Replica, ServiceConfig
from workers.cost import cost_summary

WINDOW = timedelta(days=1)


def priced_replicas() -> list[PricedReplica]:
    return [
        PricedReplica(r.region.name, r.kind, r.state, float(r.hourly_price))
        for r in Replica.objects.select_related("region")
    ]


def region_loads(since: timezone.datetime) -> list[RegionLoad]:
    rows = MetricRollup.objects.filter(
        scope=MetricRollup.Scope.REGION, interval_end__gte=since
    ).order_by("interval_end")
    return [
        RegionLoad(
            r.name,
            r.interval_end,
            r.requests / max((r.interval_end - r.interval_start).total_seconds(), 1e-9),
        )
        for r in rows
    ]


def target_rps() -> float:
    # The autoscaler's own sizing rule, so the baseline sizes replicas as it would.
    values = list(ServiceConfig.objects.values_list("target_qps_per_replica", flat=True))
    return max(min(values), 1e-6) if values else 2.0


@staff_member_required
def cost(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    replicas, loads, rps = priced_replicas(), region_loads(now - WINDOW), target_rps()
    # Spend is the billing ledger's: per replica, per second, from launch.
    spend = float(cost_summary(now).total)
    summary = summarize(replicas, loads, target_rps=rps, spend_total=spend)
    times, saved = savings_series(
        loads, hourly_now=summary.hourly_total, price=summary.on_demand_price, target_rps=rps
    )
    kinds = [k for k, _ in Replica.Kind.choices]
    context = {
        "summary": summary,
        "kinds": kinds,
        "rows": [
            (region, [by_kind.get(k, 0.0) for k in kinds], sum(by_kind.values()))
            for region, by_kind in summary.hourly_by_region.items()
        ],
        "series": {"t": times, "saved": saved},
        "target_rps": rps,
    }
    return render(request, "console/cost.html", context)
