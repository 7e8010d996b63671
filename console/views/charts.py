"""Charts page (plotly, served from our own static files) and its history endpoint.

The page streams the last 15 minutes from live snapshots and loads history from the
region rollups for a chosen range; ``policy_changed`` Events come with it so the
page marks each switch on the time axis (to see its effect, SkyLB §5's comparison)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from fleet.models import Event, MetricRollup

RANGES_MIN = (15, 60, 360, 1440, 10080)
MAX_POINTS = 2000  # per region; rows are thinned evenly beyond this


@staff_member_required
def charts(request: HttpRequest) -> HttpResponse:
    return render(request, "console/charts.html", {"ranges": RANGES_MIN})


def _thin(rows: list[MetricRollup]) -> list[MetricRollup]:
    step = max(1, len(rows) // MAX_POINTS)
    return rows[::step]


@staff_member_required
def history(request: HttpRequest) -> JsonResponse:
    try:
        minutes = int(request.GET.get("minutes", "60"))
    except ValueError:
        minutes = 60
    minutes = min(max(minutes, 1), RANGES_MIN[-1])
    since = timezone.now() - timedelta(minutes=minutes)
    rows = MetricRollup.objects.filter(
        scope=MetricRollup.Scope.REGION, interval_end__gte=since
    ).order_by("interval_end")
    series: dict[str, list[MetricRollup]] = {}
    for row in rows:
        series.setdefault(row.name, []).append(row)
    return JsonResponse(
        {
            "regions": {name: _series(_thin(points)) for name, points in series.items()},
            "policy_changes": [
                {"at": e.created_at.isoformat(), "message": e.message}
                for e in Event.objects.filter(kind="policy_changed", created_at__gte=since)
            ],
        }
    )


def _series(rows: list[MetricRollup]) -> dict[str, list[object]]:
    return {
        "t": [r.interval_end.isoformat() for r in rows],
        "hit_rate": [r.cached_token_ratio for r in rows],
        "queue": [r.queue_length + (r.waiting or 0) for r in rows],
        "throughput": [r.throughput_tokens_s for r in rows],
        "rps": [
            r.requests / max((r.interval_end - r.interval_start).total_seconds(), 1e-9)
            for r in rows
        ],
        "ttft_p50": [r.ttft_p50_s for r in rows],
        "ttft_p90": [r.ttft_p90_s for r in rows],
    }
