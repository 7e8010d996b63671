"""``GET /metrics/cost``: ``workers.cost.cost_summary`` as Prometheus text, the same
summary the Cost page lays out.

Served by the console process (not the balancers: billing is control-plane data that
needs the database).  It wants credentials: a staff session, or
``MERIDIAN_METRICS_TOKEN`` or the internal token as a bearer token.  Money is USD
over the window ``MERIDIAN_COST_WINDOW_S``; a saving with nothing to compare
against is ``NaN``.
"""

from __future__ import annotations

from decimal import Decimal

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from routing.internal_auth import may_scrape
from workers.cost import cost_summary
from workers.costing import CostSummary


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _ratio(value: Decimal | None) -> str:
    return "NaN" if value is None else f"{value:f}"


def _rates(summary: CostSummary) -> list[str]:
    return [
        "# HELP meridian_cost_rate_usd_per_hour Hourly price of the replicas billed now.",
        "# TYPE meridian_cost_rate_usd_per_hour gauge",
        *(
            f'meridian_cost_rate_usd_per_hour{{region="{_label(region)}",kind="{_label(kind)}"}}'
            f" {rate:f}"
            for region, by_kind in summary.hourly_by_region.items()
            for kind, rate in sorted(by_kind.items())
        ),
    ]


def render_cost(summary: CostSummary) -> str:
    peak, regional = summary.peak, summary.regional_peak_cost
    window = summary.window_seconds
    lines = [
        "# HELP meridian_cost_window_seconds Length of the accounting window.",
        "# TYPE meridian_cost_window_seconds gauge",
        f"meridian_cost_window_seconds {window:g}",
        "# HELP meridian_cost_usd Billed cost over the window, cold start included.",
        "# TYPE meridian_cost_usd gauge",
        f"meridian_cost_usd {summary.total:f}",
        "# HELP meridian_cost_by_kind_usd Billed cost by replica kind.",
        "# TYPE meridian_cost_by_kind_usd gauge",
    ]
    lines += [
        f'meridian_cost_by_kind_usd{{kind="{_label(k)}"}} {v:f}'
        for k, v in sorted(summary.by_kind.items())
    ]
    lines += [
        "# HELP meridian_cost_by_region_usd Billed cost by region.",
        "# TYPE meridian_cost_by_region_usd gauge",
    ]
    lines += [
        f'meridian_cost_by_region_usd{{region="{_label(k)}"}} {v:f}'
        for k, v in sorted(summary.by_region.items())
    ]
    lines += [
        "# HELP meridian_cost_on_demand_reference_usd N_tar on-demand replicas over the window.",
        "# TYPE meridian_cost_on_demand_reference_usd gauge",
        f"meridian_cost_on_demand_reference_usd {summary.on_demand_reference:f}",
        "# HELP meridian_cost_savings_vs_on_demand_ratio Fraction saved against all on-demand.",
        "# TYPE meridian_cost_savings_vs_on_demand_ratio gauge",
        f"meridian_cost_savings_vs_on_demand_ratio {_ratio(summary.savings_vs_on_demand)}",
        "# HELP meridian_reserved_replicas Reserved replicas, region-local vs global peak.",
        "# TYPE meridian_reserved_replicas gauge",
        f'meridian_reserved_replicas{{provisioning="regional_peak"}} {peak.regional_replicas}',
        f'meridian_reserved_replicas{{provisioning="global_peak"}} {peak.global_replicas}',
        "# HELP meridian_reserved_cost_usd Reserved-price cost of either provisioning.",
        "# TYPE meridian_reserved_cost_usd gauge",
        f'meridian_reserved_cost_usd{{provisioning="regional_peak"}} {regional:f}',
        f'meridian_reserved_cost_usd{{provisioning="global_peak"}} {summary.global_peak_cost:f}',
        "# HELP meridian_cost_savings_vs_region_peak_ratio Reservations the global peak saves.",
        "# TYPE meridian_cost_savings_vs_region_peak_ratio gauge",
        f"meridian_cost_savings_vs_region_peak_ratio {_ratio(summary.savings_vs_region_peak)}",
        *_rates(summary),
    ]
    return "\n".join(lines) + "\n"


@require_GET
def cost_metrics(request: HttpRequest) -> HttpResponse:
    # Billing is the operator's business: a staff session, the metrics token (a
    # Prometheus scrape) or the internal token.
    if not (request.user.is_staff or may_scrape(request, open_without_token=False)):
        response = HttpResponse("credentials required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = "Bearer"
        return response
    text = render_cost(cost_summary(timezone.now()))
    return HttpResponse(text, content_type="text/plain; version=0.0.4; charset=utf-8")
