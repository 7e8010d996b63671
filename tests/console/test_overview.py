from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client

from fleet.models import Event, Replica


@pytest.mark.django_db
def test_overview_requires_a_staff_login(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_sees_every_region_its_replicas_and_events(staff: Client) -> None:
    Event.record("replica_ready", "us-east-r1 is ready", subject="us-east-r1")
    html = staff.get("/").content.decode()
    for region in ("us-east", "eu-west", "ap-southeast"):
        assert f'data-region="{region}"' in html
    assert html.count("data-replica=") == 9
    assert "2/4" in html  # us-east: two of four replicas ready
    assert "us-east-r1 is ready" in html


def test_cost_now_is_what_the_cost_page_bills_per_region(staff: Client) -> None:
    # A replica still provisioning is billed (clouds bill from launch): the overview's
    # "Cost now" and the Cost page's rate table must agree on it.
    Replica.objects.filter(region__name="us-east").update(hourly_price=0)
    Replica.objects.filter(name="us-east-r3").update(state="provisioning", hourly_price=2.5)
    html = staff.get("/").content.decode()
    us_east = html[html.index('data-region="us-east"') :]
    assert us_east.split('data-field="cost">', 1)[1].startswith("$2.50/h<")
    rates = staff.get("/console/cost").context["summary"].hourly_by_region["us-east"]
    assert sum(rates.values()) == Decimal("2.5")
