"""Fixtures shared by the console's page tests."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.support.demo_fleet import seed_demo_fleet


@pytest.fixture
def staff(client: Client, db: None) -> Client:
    """A logged-in superuser's client over the seeded demo topology."""
    seed_demo_fleet(ready={"us-east-r1", "us-east-r2"})
    User.objects.create_superuser("ops", "", "pw-for-tests")
    client.login(username="ops", password="pw-for-tests")
    return client
