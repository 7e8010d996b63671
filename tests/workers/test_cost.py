"""Cost accounting against the database: per-second billing from launch, rollups per
region and kind, the two savings references, and ``GET /metrics/cost``.  The rules
alone are tested in ``test_costing``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from fleet.models import MetricRollup, Replica, ServiceConfig
from routing.internal_auth import install_headers
from tests.support.rows import Rows
from workers.cost import cost_summary

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


@pytest.fixture
def fleet(rows: Rows, settings: Any) -> None:
    settings.MERIDIAN_CLOUD_ON_DEMAND_PRICE = 3.0
    us, eu = rows.region("us"), rows.region("eu")
    # Spot in us since before the window: only the window's hour counts, $0.90/h x 1 h.
    rows.replica("us-spot", us, kind="spot", hourly_price=Decimal("0.9"), launched_at=at(-90))
    # On-demand fallback in us for 20 minutes, cold start included: $3.00/h x 1/3 h = $1.00.
    rows.replica(
        "us-od",
        us,
        kind="on-demand",
        hourly_price=Decimal("3"),
        launched_at=at(-50),
        terminated_at=at(-30),
        state=Replica.State.TERMINATED,
    )
    # Registered by an operator 30 minutes ago (no launch): bills from created_at, $1.00.
    rows.replica("eu-reserved", eu, kind="reserved", hourly_price=Decimal("2"), created_at=at(-30))
    # Preempted before the window opened: nothing.
    rows.replica(
        "eu-gone",
        eu,
        kind="spot",
        hourly_price=Decimal("1"),
        launched_at=at(-200),
        terminated_at=at(-100),
        state=Replica.State.PREEMPTED,
    )
    ServiceConfig.objects.create(
        model_name="m", target_replicas=2, reserved_hourly_price=Decimal("1.5")
    )


@pytest.mark.django_db
def test_billing_from_launch_adds_up_exactly(fleet: None) -> None:
    summary = cost_summary(NOW, window_s=3600)
    assert summary.by_replica == {
        "us-spot": Decimal("0.9"),
        "us-od": Decimal("1"),
        "eu-reserved": Decimal("1"),
    }
    assert summary.total == Decimal("2.9")
    assert summary.by_kind == {
        "spot": Decimal("0.9"),
        "on-demand": Decimal("1"),
        "reserved": Decimal("1"),
    }
    assert summary.by_region == {"us": Decimal("1.9"), "eu": Decimal("1")}
    # All on-demand at N_tar = 2: 2 x $3/h x 1 h.
    assert summary.on_demand_reference == Decimal("6")
    assert summary.savings_vs_on_demand == (Decimal("6") - Decimal("2.9")) / Decimal("6")


@pytest.mark.django_db
def test_regional_peaks_cost_more_than_the_global_peak(fleet: None) -> None:
    # us peaks in the first interval, eu in the second (SkyLB Figure 2's offset diurnals).
    for i, (us_req, eu_req) in enumerate([(600, 60), (60, 600)]):
        start, end = at(-20 + 10 * i), at(-10 + 10 * i)
        for region, requests in (("us", us_req), ("eu", eu_req)):
            MetricRollup.objects.create(
                scope="region",
                name=region,
                interval_start=start,
                interval_end=end,
                requests=requests,
            )
    summary = cost_summary(NOW, window_s=3600)
    # Per region: ceil(1.0/2)=1 each -> 2 reserved; globally ceil(1.1/2) = 1.
    assert (summary.peak.regional_replicas, summary.peak.global_replicas) == (2, 1)
    assert summary.regional_peak_cost == Decimal("3")
    assert summary.global_peak_cost == Decimal("1.5")


@pytest.mark.django_db
def test_metrics_cost_is_prometheus_text(fleet: None, client: Client) -> None:
    assert client.get("/metrics/cost").status_code == 401  # billing needs credentials
    response = client.get("/metrics/cost", headers=install_headers())
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    lines = response.content.decode().splitlines()
    assert "meridian_cost_window_seconds 3600" in lines
    assert any(line.startswith('meridian_cost_by_kind_usd{kind="spot"}') for line in lines)
    assert any(
        line.startswith('meridian_reserved_replicas{provisioning="global_peak"}') for line in lines
    )


@pytest.mark.django_db
def test_baseline_replicas_follow_the_controller_or_the_registered_fleet(
    rows: Rows, settings: Any
) -> None:
    settings.MERIDIAN_CLOUD_ON_DEMAND_PRICE = 2.0
    us = rows.region("us")
    rows.replica("a", us, kind="spot", hourly_price=Decimal("1"), launched_at=at(-60))
    rows.replica(
        "b", us, kind="spot", hourly_price=Decimal("1"), launched_at=at(-60), model_name="own"
    )
    ServiceConfig.objects.create(model_name="m", scaling_policy="spothedge", min_replicas=3)
    ServiceConfig.objects.create(model_name="own")  # no scaling policy: its replicas count
    summary = cost_summary(NOW, window_s=3600)
    # "m" before the controller's first step: min_replicas = 3; "own": 1 billed replica.
    assert summary.n_target == 4
    # No on-demand replica billed: the configured price, 4 x $2/h x 1 h.
    assert summary.on_demand_reference == Decimal(8)
