"""Cost page: $/hour now by region and kind, spend over the cost window, savings against
all on-demand and region-local peak reservations, and savings over time.

Every figure is ``workers.cost.cost_summary``'s, the summary ``GET /metrics/cost``
exports, so the two never disagree; this view only lays it out.
"""

from __future__ import annotations

from decimal import Decimal

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from fleet.models import Replica
from workers.cost import cost_summary
from workers.costing import CostSummary


def percent(ratio: Decimal | None) -> Decimal | None:
    return None if ratio is None else ratio * 100


def cost_context(summary: CostSummary) -> dict[str, object]:
    kinds = [k for k, _ in Replica.Kind.choices]
    return {
        "summary": summary,
        "window_h": summary.window_seconds / 3600,
        "saving_on_demand_pct": percent(summary.savings_vs_on_demand),
        "saving_region_peak_pct": percent(summary.savings_vs_region_peak),
        "kinds": kinds,
        "rows": [
            (region, [by_kind.get(k, Decimal(0)) for k in kinds], sum(by_kind.values()))
            for region, by_kind in summary.hourly_by_region.items()
        ],
        "series": {
            "t": [moment.isoformat() for moment, _ in summary.savings_series],
            "saved": [round(float(saved), 4) for _, saved in summary.savings_series],
        },
    }


@staff_member_required
def cost(request: HttpRequest) -> HttpResponse:
    context = cost_context(cost_summary(timezone.now()))
    return render(request, "console/cost.html", context)
