"""The topology token (``fleet.topology_change``): every write a balancer's snapshot can
see redraws it, and no other write does, so an idle balancer may skip the full read
while the token stands."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator
from decimal import Decimal

import pytest
from django.db import models
from django.utils import timezone

from core.topology import TopologySnapshot
from fleet.models import ApiKey, Balancer, Region, RegionLatency, Replica, ServiceConfig, Zone
from fleet.topology_change import SNAPSHOT_FIELDS, current_token, topology_changed
from routing.topology import load_snapshot
from tests.support.rows import Rows

pytestmark = pytest.mark.django_db


def _topology() -> dict[type[models.Model], models.Model]:
    """Two regions with a balancer and a replica each, a third region, a service and a
    key; returns one row of every tracked model that us-lb's snapshot reads."""
    rows = Rows()
    us, eu = rows.region("us-east"), rows.region("eu-west")
    rows.region("ap-south")
    rows.rtt(us, eu, 80.0)
    us_lb = rows.balancer("us-lb", us)
    rows.balancer("eu-lb", eu)
    replica = rows.replica("us-r1", us)
    rows.replica("eu-r1", eu)
    service = ServiceConfig.objects.create(model_name="m", policy="meridian")
    key, _ = ApiKey.issue("team")
    return {
        Region: us,
        Zone: us.zones.get(),
        RegionLatency: RegionLatency.objects.get(source=us, target=eu),
        Balancer: us_lb,
        Replica: replica,
        ServiceConfig: service,
        ApiKey: key,
    }


def _fields(model: type[models.Model]) -> Iterator[models.Field]:  # type: ignore[type-arg]
    for field in model._meta.concrete_fields:
        if not field.primary_key:
            yield field


def _another_value(field: models.Field, value: object) -> object:  # type: ignore[type-arg]
    """A valid value of ``field`` different from ``value``."""
    if isinstance(field, models.ForeignKey):
        model = field.related_model
        return model.objects.exclude(pk=getattr(value, "pk", None)).order_by("pk").last()
    if field.choices:
        return next(choice for choice, _ in field.choices if choice != value)
    if isinstance(field, models.BooleanField):
        return not value
    if isinstance(field, models.DecimalField):
        return (value or Decimal(0)) + 1
    if isinstance(field, models.FloatField):
        return float(value or 0.0) + 1.5
    if isinstance(field, models.IntegerField):
        return int(value or 0) + 1
    if isinstance(field, models.DateTimeField):
        return timezone.now() + datetime.timedelta(days=1)
    if isinstance(field, models.JSONField):
        return ["changed"] if isinstance(value, list) else {"changed": 1}
    if isinstance(field, models.CharField):
        return (str(value) + "x")[-field.max_length :] if value else "changed"
    raise AssertionError(f"no other value for {field!r}")


def _change(row: models.Model, field: models.Field) -> None:  # type: ignore[type-arg]
    setattr(row, field.name, _another_value(field, getattr(row, field.name)))
    row.save(update_fields=[field.name])


def _as_read(snapshot: TopologySnapshot) -> TopologySnapshot:
    return dataclasses.replace(snapshot, loaded_at=0.0, change_token=None)


def test_every_field_a_snapshot_reads_redraws_the_token_when_saved() -> None:
    rows = _topology()
    for model, names in SNAPSHOT_FIELDS.items():
        for field in _fields(model):
            if field.name not in names:
                continue
            before = current_token()
            _change(rows[model], field)
            assert current_token() != before, f"{model.__name__}.{field.name}"


def test_saves_of_other_fields_leave_both_the_token_and_the_snapshot_as_they_were() -> None:
    # The guard on SNAPSHOT_FIELDS: a field the snapshot reads but the list forgets
    # would change the snapshot here while the token stood still.
    rows = _topology()
    for model, names in SNAPSHOT_FIELDS.items():
        for field in _fields(model):
            if field.name in names:
                continue
            token, snapshot = current_token(), _as_read(load_snapshot("us-lb"))
            _change(rows[model], field)
            where = f"{model.__name__}.{field.name}"
            assert current_token() == token, where
            assert _as_read(load_snapshot("us-lb")) == snapshot, where


def test_creating_deleting_and_saving_whole_rows_redraw_the_token() -> None:
    rows = _topology()
    before = current_token()
    replica = Rows().replica("us-r2", rows[Region])  # type: ignore[arg-type]
    created = current_token()
    replica.save()  # no update_fields: any field may have changed
    saved = current_token()
    replica.delete()
    assert len({before, created, saved, current_token()}) == 4


def test_a_missing_row_reads_as_unknown_and_the_next_change_recreates_it() -> None:
    from fleet.models import TopologyChange

    TopologyChange.objects.all().delete()
    assert current_token() is None
    topology_changed()
    assert current_token() is not None
