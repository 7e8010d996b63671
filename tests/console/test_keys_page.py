"""The API keys page: every key with its limits and rolled-up usage."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.models import ApiKey

pytestmark = pytest.mark.django_db


def test_the_keys_page_shows_limits_and_usage(staff: Client) -> None:
    key = ApiKey.issue("limited")[0]
    ApiKey.objects.filter(pk=key.pk).update(
        requests_per_minute=42, token_budget=900, budget_period="day", usage_requests=7,
        allowed_models=["meridian-demo"],
    )  # fmt: skip
    html = staff.get("/console/keys").content.decode()
    assert f'data-key="{key.prefix}"' in html
    assert "42" in html and "900 / day" in html and "meridian-demo" in html
    assert '<td data-field="requests">7</td>' in html
