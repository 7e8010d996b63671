"""The forecast beat over real rollup rows and a real Redis: refit, then move on."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis
from django.test import override_settings

from fleet.models import MetricRollup
from ops.embedded_redis import EmbeddedRedis
from workers.forecasting import ALL, FORECAST_KEY, ForecastSettings, forecast_workload, load
from workers.tasks import forecast_workload as forecast_task

WINDOW = 600.0
DAY = 144


def prompt_truth(index: int, region: str) -> float:
    scale = 100_000.0 if region == "us" else 40_000.0
    return scale * (1.0 + 0.5 * math.sin(2 * math.pi * index / DAY))


@pytest.fixture
def client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    scopes = ("us", "eu", ALL)
    client.delete(*(FORECAST_KEY.format(scope=s) for s in scopes))
    yield client
    client.delete(*(FORECAST_KEY.format(scope=s) for s in scopes))
    client.close()


def add_rollups(now_window: int, days: int) -> None:
    rows = []
    for index in range(now_window - days * DAY, now_window):
        for region in ("us", "eu"):
            # Two rollups per window: the beat must sum them.
            for half in (0, 1):
                end = datetime.fromtimestamp(index * WINDOW + 100 + 300 * half, tz=UTC)
                prompt = prompt_truth(index, region) / 2
                rows.append(
                    MetricRollup(
                        scope=MetricRollup.Scope.REGION,
                        name=region,
                        interval_start=end,
                        interval_end=end,
                        prompt_tokens=round(prompt),
                        completion_tokens=round(prompt / 4),
                    )
                )
    MetricRollup.objects.bulk_create(rows)


@pytest.mark.django_db
def test_the_beat_forecasts_each_region_and_all_from_the_rollups(
    client: redis.Redis, redis_server: EmbeddedRedis
) -> None:
    now = time.time()
    now_window = math.floor(now / WINDOW)
    add_rollups(now_window, days=3)
    with override_settings(REDIS_URL=redis_server.url, MERIDIAN_FORECAST_WINDOW_S=WINDOW):
        results = forecast_task.apply().get()
    assert {r["scope"] for r in results} == {"us", "eu", ALL}
    assert all(r["refitted"] for r in results)
    for scope in ("us", "eu", ALL):
        stored = load(client, scope)
        assert stored is not None and stored["next_window"] == now_window
        forecast = stored["forecast"]
        assert isinstance(forecast, dict)
        for k in (0, 1):
            want = sum(
                prompt_truth(now_window + k, r)
                for r in (("us", "eu") if scope == ALL else (scope,))
            )
            assert abs(forecast["prompt"][k] - want) / want < 0.05
            assert abs(forecast["decode"][k] - want / 4) / (want / 4) < 0.05
        actual = stored["actual"]
        assert isinstance(actual, dict) and len(actual["prompt"]) == DAY


@pytest.mark.django_db
def test_between_refits_the_stored_models_only_take_the_new_windows(client: redis.Redis) -> None:
    settings = ForecastSettings(window_s=WINDOW, history_s=5 * 86400.0, retrain_s=86400.0)
    now_window = math.floor(time.time() / WINDOW)
    add_rollups(now_window, days=3)
    first = forecast_workload(client, now=(now_window - 2) * WINDOW + 1, settings=settings)
    assert all(r.refitted for r in first)
    later = forecast_workload(client, now=now_window * WINDOW + 1, settings=settings)
    assert not any(r.refitted for r in later)
    assert {r.next_window for r in later} == {now_window}
    us = next(r for r in later if r.scope == "us")
    assert (
        abs(us.prompt[0] - prompt_truth(now_window, "us")) / prompt_truth(now_window, "us") < 0.05
    )
    # A day on, the model is refitted.
    after = forecast_workload(client, now=(now_window + DAY) * WINDOW + 1, settings=settings)
    assert all(r.refitted for r in after)


@pytest.mark.django_db
def test_too_little_history_stores_nothing_and_a_corrupt_entry_is_refitted(
    client: redis.Redis,
) -> None:
    settings = ForecastSettings(window_s=WINDOW)
    now_window = math.floor(time.time() / WINDOW)
    add_rollups(now_window, days=0)
    MetricRollup.objects.create(
        scope=MetricRollup.Scope.REGION,
        name="us",
        interval_start=datetime.fromtimestamp((now_window - 1) * WINDOW, tz=UTC),
        interval_end=datetime.fromtimestamp((now_window - 1) * WINDOW + 10, tz=UTC),
        prompt_tokens=10,
    )
    assert forecast_workload(client, now=now_window * WINDOW + 1, settings=settings) == []
    assert load(client, "us") is None
    add_rollups(now_window - 1, days=1)
    client.set(FORECAST_KEY.format(scope="us"), json.dumps({"prompt_model": {"alpha": 1}}))
    found = forecast_workload(client, now=now_window * WINDOW + 1, settings=settings)
    assert next(r for r in found if r.scope == "us").refitted


def test_a_window_that_does_not_divide_a_day_is_refused() -> None:
    with pytest.raises(ValueError, match="does not divide a day"):
        ForecastSettings(window_s=700.0).config()
