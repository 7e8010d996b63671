"""Fixtures shared by the console's page tests."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from fleet.models import Replica
from ops.demo import plan_demo, seed_demo


@pytest.fixture
def staff(client: Client) -> Client:
    """A logged-in superuser's client over the seeded demo topology."""
    seed_demo(plan_demo("127.0.0.1", 8100, 9100))
    Replica.objects.filter(name__in=["us-east-r1", "us-east-r2"]).update(state="ready")
    User.objects.create_superuser("ops", "", "pw-for-tests")
    client.login(username="ops", password="pw-for-tests")
    return client
