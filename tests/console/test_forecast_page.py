"""The Forecast page: the bench's APE report plotted, and the beat's live forecasts."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.test import Client

from ops.embedded_redis import EmbeddedRedis
from tests.support.workload_files import write_azure, write_servegen
from workers.forecasting import ALL, FORECAST_KEY, ForecastSettings, WindowTotals, forecast_scope


@pytest.fixture
def var_dir(tmp_path: Path, settings) -> Path:  # type: ignore[no-untyped-def]
    settings.VAR_DIR = tmp_path / "var"
    return tmp_path / "var"


@pytest.mark.django_db
def test_the_bench_report_and_the_live_forecast_are_on_the_page(
    staff: Client,
    var_dir: Path,
    tmp_path: Path,
    redis_server: EmbeddedRedis,
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.REDIS_URL = redis_server.url
    html = staff.get("/console/forecast").content.decode()
    assert 'id="no-report"' in html and 'id="no-live"' in html

    folder = write_servegen(tmp_path / "m-tiny", windows=4 * 144)
    csv = write_azure(tmp_path / "conv.csv", minutes=40)
    call_command("bench", "forecaster", "--servegen", str(folder), "--azure", str(csv))
    report = json.loads((var_dir / "forecasts" / "ape.json").read_text())
    tiny = next(s for s in report["series"] if s["trace"] == "servegen/m-tiny")
    assert tiny["mean_ape"] < 0.02  # a clean daily sine, forecast two windows ahead

    client = redis.Redis.from_url(redis_server.url)
    now_window = math.floor(time.time() / 600)
    totals = WindowTotals(now_window - 20, tuple(range(100, 120)), tuple(range(10, 30)))
    forecast_scope(client, ALL, totals, now_window, ForecastSettings())
    try:
        html = staff.get("/console/forecast").content.decode()
    finally:
        client.delete(FORECAST_KEY.format(scope=ALL))
        client.close()
    assert "servegen/m-tiny" in html and "azure/conv" in html and "4.15-8.45 %" in html
    assert 'id="ape-report"' in html and 'id="live-forecasts"' in html
    assert "prompt_model" not in html  # the page gets forecasts, not model internals
