from __future__ import annotations

import pytest
from django.test import Client

from fleet.models import Event


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
