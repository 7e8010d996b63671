"""A database made before the models moved to ``fleet`` migrates without losing a row.

The models lived in the console app until its migration 0004.  The test takes this
session's database back to that state (console 0004 applied, fleet unapplied), writes
rows through the models *as they were then*, and migrates forward again: every row is
read back through today's ``fleet`` models, and the content types (which permissions
and admin history point at) moved with them.  It runs on SQLite and on PostgreSQL,
like the rest of the suite.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from fleet.models import ApiKey, Event, Region, RegionLatency, Replica, ServiceConfig, Zone

BEFORE_THE_MOVE = [("console", "0004_drill_kinds"), ("fleet", None)]


def _migrate(targets: list[tuple[str, str | None]]) -> Any:
    """Migrate to ``targets``; returns the historical apps of that state."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    executor = MigrationExecutor(connection)  # a fresh loader reads what is applied now
    return executor.loader.project_state(list(executor.loader.applied_migrations)).apps


def _latest() -> list[tuple[str, str | None]]:
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


@pytest.mark.django_db(transaction=True)
def test_rows_written_by_the_old_console_models_survive_the_move() -> None:
    old = _migrate(BEFORE_THE_MOVE)
    content_type = old.get_model("contenttypes", "ContentType")
    permission = old.get_model("auth", "Permission")
    old_replica_type = content_type.objects.get(app_label="console", model="replica")
    permission.objects.get_or_create(
        codename="drain_replica", name="Can drain a replica", content_type=old_replica_type
    )

    region = old.get_model("console", "Region").objects.create(name="us-east")
    far = old.get_model("console", "Region").objects.create(name="eu-west")
    zone = old.get_model("console", "Zone").objects.create(region=region, name="us-east-1")
    old.get_model("console", "RegionLatency").objects.create(source=region, target=far, rtt_ms=80.0)
    balancer = old.get_model("console", "Balancer").objects.create(
        name="us-east-lb", region=region, url="http://127.0.0.1:8101"
    )
    old.get_model("console", "Replica").objects.create(
        name="us-east-r1",
        url="http://127.0.0.1:9101",
        model_name="m",
        region=region,
        zone=zone,
        balancer=balancer,
        kind="spot",
        hourly_price=Decimal("0.7500"),
        state="ready",
    )
    old.get_model("console", "ServiceConfig").objects.create(
        model_name="m", policy="skylb", policy_params={"push_budget": 2}
    )
    old.get_model("console", "ApiKey").objects.create(name="ci", prefix="mk-abc", key_hash="f" * 64)
    old.get_model("console", "Event").objects.create(
        kind="policy_changed", message="m: least_load -> skylb", data={"actor": "ops"}
    )

    _migrate(_latest())

    replica = Replica.objects.select_related("zone", "balancer", "region").get()
    assert (replica.name, replica.zone.name, replica.balancer.name) == (
        "us-east-r1",
        "us-east-1",
        "us-east-lb",
    )
    assert (replica.kind, replica.hourly_price, replica.state) == ("spot", Decimal("0.75"), "ready")
    assert RegionLatency.objects.get().rtt_ms == 80.0
    assert sorted(Region.objects.values_list("name", flat=True)) == ["eu-west", "us-east"]
    assert Zone.objects.get().region.name == "us-east"
    assert ServiceConfig.objects.get().policy_params == {"push_budget": 2}
    assert ApiKey.objects.get().key_hash == "f" * 64
    assert Event.objects.get().data == {"actor": "ops"}

    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    moved = ContentType.objects.get_for_model(Replica)
    assert moved.app_label == "fleet"
    assert not ContentType.objects.filter(app_label="console", model="replica").exists()
    assert Permission.objects.get(codename="drain_replica").content_type == moved
