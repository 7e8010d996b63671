"""The ``preserve`` scaler in the live loop, on the real database and a real Redis.

The forecast is stored by the forecast beat's own code (``workers.forecasting``) from
rollup rows; the look-ahead maps are published by a real balancer runtime to its
region's live feed (``routing.live_publish``), exactly as the glue reads them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.conf import settings

from core.live_feed import stream_key
from core.types import RequestDescriptor
from fleet.models import Event, MetricRollup, Replica, ServiceConfig, Zone
from tests.support.balancers import MODEL
from tests.support.inprocess import runtime_for
from tests.support.rows import Rows
from tests.support.upstreams import Upstreams
from tests.workers.test_scaling_glue import MemoryProvider
from workers.forecasting import ALL, FORECAST_KEY, ForecastSettings, forecast_workload, load
from workers.scaling.fleet import ZoneOffer
from workers.scaling.instance_scaler import forecast_instances
from workers.scaling_glue import replica_capacity, scale_services

WINDOW = 600.0
DAY = 144
PROMPT_PER_WINDOW = 30_000.0  # one replica's profiled prompt capacity per window


def prompt_truth(index: int) -> float:
    """Both regions' prompt tokens in window ``index`` (daily sine)."""
    return 140_000.0 * (1.0 + 0.5 * math.sin(2 * math.pi * index / DAY))


@pytest.fixture
def client(redis_server: object) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = [FORECAST_KEY.format(scope=s) for s in ("us", "eu", ALL)] + [stream_key("us")]
    client.delete(*keys)
    yield client
    client.delete(*keys)
    client.close()


@pytest.fixture
def provider(rows: Rows) -> MemoryProvider:
    rows.region("us")
    rows.region("eu")
    Zone.objects.create(region=Zone.objects.get(name="us-1a").region, name="us-1b")
    return MemoryProvider([ZoneOffer(z, "us", 0.5, 2.0) for z in ("us-1a", "us-1b")])


def add_rollups(now_window: int) -> None:
    rows = []
    for index in range(now_window - 3 * DAY, now_window):
        for region, share in (("us", 100 / 140), ("eu", 40 / 140)):
            end = datetime.fromtimestamp(index * WINDOW + 300, tz=UTC)
            prompt = prompt_truth(index) * share
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


async def publish_lookahead(names: list[str], busy: str) -> None:
    """A real balancer of region ``us`` owning ``names``; ``busy`` runs one request
    whose prompt alone is over the KV cache; one record goes to the live feed."""
    upstreams = Upstreams()
    rt = await runtime_for(upstreams, replicas=tuple(names), redis_url=settings.REDIS_URL)
    try:
        request = RequestDescriptor(
            request_id="long", model=MODEL, prompt_tokens=40_000, predicted_output_tokens=500
        )
        rt.forecast.admit(busy, request, rt.monotonic())
        await rt.publish_live()
    finally:
        await rt.close()
        await upstreams.close()


@pytest.mark.django_db
def test_preserve_scales_to_the_forecast_then_adds_one_for_an_overloaded_replica(
    provider: MemoryProvider, client: redis.Redis
) -> None:
    now = datetime.now(UTC)
    now_window = math.floor(now.timestamp() / WINDOW)
    add_rollups(now_window)
    assert forecast_workload(client, now=now.timestamp(), settings=ForecastSettings())
    config = ServiceConfig.objects.create(
        model_name="m",
        scaling_policy="on_demand",
        scaler=ServiceConfig.Scaler.PRESERVE,
        min_replicas=1,
        replica_prompt_tokens_per_s=PROMPT_PER_WINDOW / WINDOW,
        replica_decode_tokens_per_s=1000.0,
        replica_total_tokens_per_s=1000.0,
    )
    stored = load(client, ALL)
    capacity = replica_capacity(config, WINDOW)
    assert stored is not None and capacity is not None
    want = forecast_instances(stored, now_window, capacity)
    assert want is not None
    # The forecast is within 5 % of the truth of the windows ahead.
    peak = max(prompt_truth(now_window), prompt_truth(now_window + 1))
    assert math.ceil(0.95 * peak / PROMPT_PER_WINDOW) <= want
    assert want <= math.ceil(1.05 * peak / PROMPT_PER_WINDOW)

    (decision,) = scale_services(provider, now)
    assert decision.n_target == want and len(decision.launched) == want
    event = Event.objects.get(kind="scaling.decision")
    assert event.data["scaler"] == "preserve" and event.data["reason"]["forecast_n"] == want
    assert f"forecast N={want}" in event.message

    Replica.objects.update(state=Replica.State.READY)
    names = sorted(Replica.objects.values_list("name", flat=True))
    asyncio.run(publish_lookahead(names, busy=names[0]))
    (decision,) = scale_services(provider, now + timedelta(seconds=1))
    assert decision.n_target == want + 1 and len(decision.launched) == 1
    assert decision.reason["overloaded"] == 1 and decision.reason["unmapped"] == 0
    latest = Event.objects.filter(kind="scaling.decision").order_by("-id").first()
    assert latest is not None
    assert f"1 of {want} ready replicas potentially overloaded +1" in latest.message


@pytest.mark.django_db
def test_request_rate_services_read_neither_forecast_nor_feed(
    provider: MemoryProvider, client: redis.Redis
) -> None:
    ServiceConfig.objects.create(model_name="m", scaling_policy="on_demand", min_replicas=2)
    (decision,) = scale_services(provider, datetime.now(UTC))
    assert (decision.scaler, decision.n_target) == ("request-rate", 2)
    assert decision.reason == {"qps": 0.0}


async def publish_idle(names: list[str]) -> None:
    """A real balancer of region ``us`` owning ``names``, nothing running on any."""
    upstreams = Upstreams()
    rt = await runtime_for(upstreams, replicas=tuple(names), redis_url=settings.REDIS_URL)
    try:
        await rt.publish_live()
    finally:
        await rt.close()
        await upstreams.close()


@pytest.mark.django_db
def test_preserve_scales_an_idle_fleet_down_once_through_the_drain_path(
    provider: MemoryProvider, client: redis.Redis
) -> None:
    now = datetime.now(UTC)
    config = ServiceConfig.objects.create(
        model_name="m",
        scaling_policy="on_demand",
        scaler=ServiceConfig.Scaler.PRESERVE,
        min_replicas=3,
        replica_prompt_tokens_per_s=50.0,
        replica_decode_tokens_per_s=50.0,
        replica_total_tokens_per_s=50.0,
    )
    (decision,) = scale_services(provider, now)  # no forecast stored: min_replicas
    assert decision.n_target == 3 and decision.reason["forecast_n"] is None
    Replica.objects.update(state=Replica.State.READY)
    ServiceConfig.objects.filter(pk=config.pk).update(min_replicas=1)
    names = sorted(Replica.objects.values_list("name", flat=True))
    # Before any balancer reports the replicas their load is unknown: nothing goes.
    (decision,) = scale_services(provider, now + timedelta(seconds=1))
    assert decision.n_target == 3 and decision.reason["unmapped"] == 3
    asyncio.run(publish_idle(names))
    (decision,) = scale_services(provider, now + timedelta(seconds=2))
    assert decision.n_target == 1 and decision.reason["scaled_down_to"] == 0
    assert len(decision.terminated) == 2
    # Ready replicas are drained first, not cut: out of routing, still launched.
    draining = Replica.objects.filter(state=Replica.State.DRAINING)
    assert draining.count() == 2 and len(provider.instances) == 3
    assert Event.objects.filter(kind="replica.draining", data__reason="scale-down").count() == 2
