"""The Cost page and ``GET /metrics/cost`` show the same figures for the same fleet:
both read ``workers.costing``'s summary (the rules are tested in tests/workers)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import MetricRollup, Replica

NOW = timezone.now()


@pytest.fixture
def frozen_fleet(staff: Client, monkeypatch: pytest.MonkeyPatch) -> Client:
    """The demo fleet launched 40 minutes ago, one spot replica preempted 10 minutes
    ago, offset regional peaks, and a clock both requests read the same."""
    Replica.objects.update(launched_at=NOW - timedelta(minutes=40))
    Replica.objects.filter(name="eu-west-r3").update(
        state=Replica.State.PREEMPTED, terminated_at=NOW - timedelta(minutes=10)
    )
    for i, by_region in enumerate(
        [{"us-east": 900, "eu-west": 60}, {"us-east": 60, "eu-west": 600}]
    ):
        end = NOW - timedelta(minutes=10 * (2 - i))
        for region, requests in by_region.items():
            MetricRollup.objects.create(
                scope="region",
                name=region,
                interval_start=end - timedelta(minutes=5),
                interval_end=end,
                requests=requests,
            )
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    return staff


def metrics(client: Client) -> dict[str, Decimal]:
    text = client.get("/metrics/cost").content.decode()
    return {
        name: Decimal(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line[0] != "#")
    }


def card(html: str, card_id: str) -> str:
    match = re.search(rf'id="{card_id}">.*?<div class="big">([^<]*)</div>', html, re.S)
    assert match is not None, card_id
    return match.group(1)


def shown(value: Decimal, places: str) -> str:
    return str(value.quantize(Decimal(places), ROUND_HALF_UP))


@pytest.mark.django_db
def test_the_page_and_metrics_cost_show_the_same_savings(frozen_fleet: Client) -> None:
    html = frozen_fleet.get("/console/cost").content.decode()
    exported = metrics(frozen_fleet)
    on_demand = exported["meridian_cost_savings_vs_on_demand_ratio"]
    region_peak = exported["meridian_cost_savings_vs_region_peak_ratio"]
    assert card(html, "saving-on-demand") == f"{shown(on_demand * 100, '0.1')} %"
    assert card(html, "saving-region-peak") == f"{shown(region_peak * 100, '0.1')} %"
    assert card(html, "spend") == f"${shown(exported['meridian_cost_usd'], '0.01')}"
    # The demo's on-demand replica beats all on-demand; us and eu peak apart (SkyLB).
    assert 0 < on_demand < 1 and 0 < region_peak < 1


@pytest.mark.django_db
def test_the_page_and_metrics_cost_bill_the_same_replicas_now(frozen_fleet: Client) -> None:
    html = frozen_fleet.get("/console/cost").content.decode()
    exported = metrics(frozen_fleet)
    rates = {k: v for k, v in exported.items() if k.startswith("meridian_cost_rate_usd_per_hour")}
    total = sum(rates.values(), Decimal(0))
    assert card(html, "rate-now") == f"${shown(total, '0.01')}/h"
    assert not any('region="eu-west",kind="spot"' in k for k in rates)  # preempted
    for region in ("us-east", "eu-west", "ap-southeast"):
        row = re.search(rf'data-region="{region}">(.*?)</tr>', html, re.S)
        in_region = sum((v for k, v in rates.items() if f'region="{region}"' in k), Decimal(0))
        assert row is not None and f"${shown(in_region, '0.01')}</strong>" in row.group(1)


@pytest.mark.django_db
def test_savings_chart_ends_at_the_saving_in_dollars(frozen_fleet: Client) -> None:
    html = frozen_fleet.get("/console/cost").content.decode()
    exported = metrics(frozen_fleet)
    script = re.search(r'id="savings-series"[^>]*>(.*?)</script>', html, re.S)
    assert script is not None
    saved = json.loads(script.group(1))["saved"]
    reference = exported["meridian_cost_on_demand_reference_usd"]
    assert saved[0] == 0
    assert saved[-1] == pytest.approx(float(reference - exported["meridian_cost_usd"]), abs=1e-4)
