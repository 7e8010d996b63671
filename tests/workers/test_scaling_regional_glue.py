"""Demand-aware placement in the live loop, on the real database and a real Redis.

The per-region forecasts are stored by the forecast beat's own code
(``workers.forecasting``) from region rollups; the RTTs are ``RegionLatency`` rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.conf import settings

from fleet.models import Event, MetricRollup, Replica, ServiceConfig, Zone
from tests.support.rows import Rows
from tests.workers.test_scaling_glue import MemoryProvider
from workers.forecasting import ALL, FORECAST_KEY, ForecastSettings, forecast_workload
from workers.scaling.fleet import ZoneOffer
from workers.scaling_glue import scale_services

WINDOW = 600.0
DAY = 144
SCOPES = ("us", "eu", ALL)


@pytest.fixture
def client(redis_server: object) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = [FORECAST_KEY.format(scope=s) for s in SCOPES]
    client.delete(*keys)
    yield client
    client.delete(*keys)
    client.close()


@pytest.fixture
def provider(rows: Rows) -> MemoryProvider:
    us, eu = rows.region("us"), rows.region("eu")
    rows.rtt(us, eu, 40.0)
    Zone.objects.create(region=us, name="us-1b")
    # On-demand is cheaper in eu: placed as one fleet, every replica would go there.
    return MemoryProvider(
        [
            ZoneOffer("us-1a", "us", 0.5, 2.0),
            ZoneOffer("us-1b", "us", 0.5, 2.0),
            ZoneOffer("eu-1a", "eu", 0.5, 1.5),
        ]
    )


def add_rollups(now_window: int) -> None:
    """Three days of daily-sine traffic, three quarters of it in us."""
    rows = []
    for index in range(now_window - 3 * DAY, now_window):
        total = 100_000.0 * (1.0 + 0.5 * math.sin(2 * math.pi * index / DAY))
        for region, share in (("us", 0.75), ("eu", 0.25)):
            end = datetime.fromtimestamp(index * WINDOW + 300, tz=UTC)
            rows.append(
                MetricRollup(
                    scope=MetricRollup.Scope.REGION,
                    name=region,
                    interval_start=end,
                    interval_end=end,
                    prompt_tokens=round(total * share),
                    completion_tokens=round(total * share / 4),
                )
            )
    MetricRollup.objects.bulk_create(rows)


def replicas_in(region: str) -> int:
    return Replica.objects.filter(region__name=region, state=Replica.State.PROVISIONING).count()


@pytest.fixture
def forecast(client: redis.Redis) -> datetime:
    now = datetime.now(UTC)
    add_rollups(math.floor(now.timestamp() / WINDOW))
    scopes = {
        f.scope for f in forecast_workload(client, now=now.timestamp(), settings=ForecastSettings())
    }
    assert scopes == set(SCOPES)
    return now


@pytest.mark.django_db
def test_replicas_go_where_the_forecast_demand_is(
    provider: MemoryProvider, forecast: datetime
) -> None:
    ServiceConfig.objects.create(model_name="m", scaling_policy="on_demand", min_replicas=8)
    (decision,) = scale_services(provider, forecast)
    assert decision.n_target == 8
    assert decision.regions["counts"] == {"eu": 2, "us": 6}
    assert (replicas_in("us"), replicas_in("eu")) == (6, 2)
    # Within us the policy spreads its share over both zones.
    per_zone = [Replica.objects.filter(zone__name=z).count() for z in ("us-1a", "us-1b")]
    assert per_zone == [3, 3]
    event = Event.objects.get(kind="scaling.decision")
    assert event.data["regions"]["counts"] == {"eu": 2, "us": 6}
    assert event.data["regions"]["spill_extra"] == 0
    assert "regions by forecast demand: eu 2 (25%), us 6 (75%)" in event.message
    config = ServiceConfig.objects.get(model_name="m")
    assert set(config.scaling_state["placement_by_region"]) == {"eu", "us"}

    # A steady beat is quiet: same split, nothing launched.
    (decision,) = scale_services(provider, forecast + timedelta(seconds=10))
    assert decision.launched == [] and decision.terminated == []
    assert Event.objects.filter(kind="scaling.decision").count() == 1


@pytest.mark.django_db
def test_a_region_without_a_forecast_leaves_placement_as_before(
    provider: MemoryProvider, forecast: datetime, client: redis.Redis
) -> None:
    client.delete(FORECAST_KEY.format(scope="eu"))
    ServiceConfig.objects.create(model_name="m", scaling_policy="on_demand", min_replicas=8)
    (decision,) = scale_services(provider, forecast)
    assert decision.regions == {}
    assert (replicas_in("us"), replicas_in("eu")) == (0, 8)  # one fleet: cheapest zone
    event = Event.objects.get(kind="scaling.decision")
    assert event.data["regions"] == {} and "regions by" not in event.message
    config = ServiceConfig.objects.get(model_name="m")
    assert "placement_by_region" not in config.scaling_state
