"""Forecast page: the workload forecaster's APE report and the live forecasts.

The report is what ``manage.py bench forecaster`` kept (``var/forecasts/ape.json``):
per trace and series, every test window's truth and forecast, plotted with plotly
beside PreServe's reported mean APE.  The live part is what the ``forecast_workload``
beat stored in Redis per region: the last day of actual tokens per window and the
forecast of the current and the next window.  The page renders without either.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.models import Region

MAX_POINTS = 1500  # per series in the report plot; thinned evenly beyond


@staff_member_required
def forecast(request: HttpRequest) -> HttpResponse:
    report = _report(Path(settings.VAR_DIR) / "forecasts" / "ape.json")
    return render(
        request,
        "console/forecast.html",
        {"report": report, "rows": (report or {}).get("series", []), "live": _live()},
    )


def _report(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("series"), list):
        return None
    for series in data["series"]:
        step = max(1, len(series.get("index", [])) // MAX_POINTS)
        for key in ("index", "truth", "forecast"):
            series[key] = series.get(key, [])[::step]
    return data


def _live() -> list[dict[str, object]]:
    """Stored forecasts per region and for all; imported late, as the replicas page does:
    the URLconf imports this module and ``manage.py check`` must not pay for redis."""
    import redis

    from workers.forecasting import ALL, load

    scopes = [*Region.objects.values_list("name", flat=True), ALL]
    try:
        with redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5) as client:
            found = [load(client, scope) for scope in scopes]
    except (redis.RedisError, ValueError):
        return []
    return [
        {k: v for k, v in entry.items() if not k.endswith("_model")}
        for entry in found
        if entry is not None
    ]
