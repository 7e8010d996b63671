"""The scaling loop against the database, with an in-memory provider: rows, events
with their inputs, persisted policy state, and the autoscaler fed by rollups."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from fleet.models import Event, MetricRollup, Replica, ServiceConfig, Zone
from fleet.topology_change import current_token
from tests.support.rows import Rows
from workers.providers.base import (
    PREEMPTION_WARNING,
    CloudProvider,
    Instance,
    LaunchSpec,
    Notice,
)
from workers.providers.static import StaticProvider
from workers.scaling.fleet import SPOT, ZoneOffer
from workers.scaling_glue import ProviderLauncher, scale_services, service_qps
from workers.tasks import scale_services as scale_services_task
from workers.tasks import worker_provider

NOW = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


class MemoryProvider(CloudProvider):
    """Launches always succeed; notices are queued by the test."""

    name = "memory"

    def __init__(self, zones: list[ZoneOffer]) -> None:
        self._zones = zones
        self.instances: dict[str, Instance] = {}
        self.pending: list[Notice] = []
        self.ids = itertools.count(1)

    def zones(self) -> list[ZoneOffer]:
        return self._zones

    def launch(self, spec: LaunchSpec, zone: str, kind: str, now: float) -> Instance | None:
        handle = f"h{next(self.ids)}"
        self.instances[handle] = Instance(
            handle, kind, zone, f"http://127.0.0.1:1/{handle}", "provisioning", now
        )
        return self.instances[handle]

    def terminate(self, handle: str, now: float) -> None:
        self.instances.pop(handle)

    def list(self) -> list[Instance]:
        return list(self.instances.values())

    def poll(self, now: float) -> list[Notice]:
        notices, self.pending = self.pending, []
        return notices


@pytest.fixture
def provider(rows: Rows) -> MemoryProvider:
    region = rows.region("us")
    for name in ("us-1b", "us-1c"):
        Zone.objects.create(region=region, name=name)
    prices = {"us-1a": 0.5, "us-1b": 0.6, "us-1c": 0.7}
    return MemoryProvider([ZoneOffer(z, "us", p, 2.0) for z, p in prices.items()])


def service(**fields: object) -> ServiceConfig:
    defaults: dict[str, object] = {
        "model_name": "m",
        "scaling_policy": "spothedge",
        "min_replicas": 2,
    }
    return ServiceConfig.objects.create(**(defaults | fields))


@pytest.mark.django_db
def test_first_beat_launches_spot_plus_fallback_and_explains_why(provider: MemoryProvider) -> None:
    service(spot_extra=1)
    (decision,) = scale_services(provider, NOW)
    assert decision.n_target == 2
    spot = Replica.objects.filter(kind=SPOT)
    zones = sorted(spot.values_list("zone__name", flat=True))
    assert zones == ["us-1a", "us-1b", "us-1c"]  # one per zone: unused zones first
    assert Replica.objects.filter(kind="on-demand").count() == 2  # nothing ready: min(2, 3 - 0)
    row = spot.first()
    assert row is not None
    assert (row.provider, row.state, row.launched_at) == ("memory", Replica.State.PROVISIONING, NOW)
    assert row.hourly_price in (Decimal("0.5"), Decimal("0.6"), Decimal("0.7"))
    event = Event.objects.get(kind="scaling.decision")
    assert event.data["n_target"] == 2 and event.data["qps"] == 0
    assert (event.data["target_spot"], event.data["target_on_demand"]) == (3, 2)
    assert ServiceConfig.objects.get().target_replicas == 2


@pytest.mark.django_db
def test_preemption_notice_marks_the_row_and_moves_the_zone(provider: MemoryProvider) -> None:
    service(spot_extra=1)
    scale_services(provider, NOW)
    Replica.objects.update(state=Replica.State.READY)
    scale_services(provider, NOW + timedelta(seconds=10))
    # Ready fallback replicas are drained, not cut: out of routing now, terminated once
    # idle (these URLs refuse connections: nothing runs there) after the settle time.
    on_demand = Replica.objects.filter(kind="on-demand")
    assert {r.state for r in on_demand} == {Replica.State.DRAINING}
    assert all(r.terminated_at is None for r in on_demand)
    decision = Event.objects.filter(kind="scaling.decision").order_by("-id").first()
    assert decision is not None
    assert sorted(decision.data["draining"]) == sorted(r.provider_handle for r in on_demand)
    assert "(2 draining first)" in decision.message
    victim = Replica.objects.filter(kind=SPOT, zone__name="us-1a").first()
    assert victim is not None
    provider.pending.append(
        Notice(victim.provider_handle, "preempted", "us-1a", NOW.timestamp() + 20)
    )
    scale_services(provider, NOW + timedelta(seconds=20))
    victim.refresh_from_db()
    assert victim.state == Replica.State.PREEMPTED and victim.terminated_at == NOW + timedelta(
        seconds=20
    )
    assert Event.objects.filter(kind="replica.preempted", subject=victim.name).exists()
    state = ServiceConfig.objects.get().scaling_state
    assert state["placement"]["preempting"] == ["us-1a"]
    assert Replica.objects.filter(kind="on-demand", terminated_at__isnull=True).count() == 1
    assert Event.objects.filter(kind="replica.drained").count() == 2


@pytest.mark.django_db
def test_preemption_warning_drains_the_replica_at_once_and_replaces_it(
    provider: MemoryProvider,
) -> None:
    service(spot_extra=1)
    scale_services(provider, NOW)
    Replica.objects.update(state=Replica.State.READY)
    scale_services(provider, NOW + timedelta(seconds=10))
    victim = Replica.objects.get(kind=SPOT, zone__name="us-1a")
    warned_at = NOW.timestamp() + 20
    provider.pending.append(
        Notice(victim.provider_handle, PREEMPTION_WARNING, "us-1a", warned_at, warned_at + 120)
    )
    scale_services(provider, NOW + timedelta(seconds=20))
    victim.refresh_from_db()
    # Out of routing at once (draining is not a routable state), still billed.
    assert victim.state == Replica.State.DRAINING and victim.terminated_at is None
    warning = Event.objects.get(kind="replica.preemption_warning", subject=victim.name)
    assert warning.data["preempt_at"] == (NOW + timedelta(seconds=140)).isoformat()
    assert Event.objects.get(kind="replica.draining", subject=victim.name).data["reason"] == (
        "preemption-warning"
    )
    state = ServiceConfig.objects.get().scaling_state
    assert state["placement"]["preempting"] == ["us-1a"]  # the policy heard it with the warning
    assert victim.provider_handle in state["draining"]
    # The replacement is launched before the preemption lands: the fallback on-demand.
    assert Replica.objects.filter(kind="on-demand", terminated_at__isnull=True).count() == 1

    provider.pending.append(
        Notice(victim.provider_handle, "preempted", "us-1a", NOW.timestamp() + 30)
    )
    scale_services(provider, NOW + timedelta(seconds=30))
    victim.refresh_from_db()
    assert victim.state == Replica.State.PREEMPTED
    assert Event.objects.filter(kind="replica.preempted", subject=victim.name).exists()
    assert ServiceConfig.objects.get().scaling_state["draining"] == {}


@pytest.mark.django_db
def test_autoscaler_reads_replica_rollups(provider: MemoryProvider) -> None:
    svc = service(
        scaling_policy="on_demand", upscale_delay_s=0, target_qps_per_replica=1.0, qps_window_s=60
    )
    zone = Zone.objects.select_related("region").get(name="us-1a")
    replica = Replica.objects.create(
        name="m-old", url="http://127.0.0.1:1/old", model_name="m", region=zone.region, zone=zone
    )
    MetricRollup.objects.create(
        scope="replica",
        name=replica.name,
        interval_start=NOW - timedelta(seconds=30),
        interval_end=NOW - timedelta(seconds=20),
        requests=180,
    )
    assert service_qps(svc, NOW) == 3.0
    (decision,) = scale_services(provider, NOW)
    assert decision.n_target == 3
    assert Replica.objects.filter(provider="memory", kind="on-demand").count() == 3


@pytest.mark.django_db
def test_static_provider_launches_nothing(rows: Rows) -> None:
    rows.region("eu")
    service()
    assert scale_services(StaticProvider([ZoneOffer("eu-1a", "eu", 1.0, 2.0)]), NOW) == []
    assert not Replica.objects.exists()


@pytest.mark.django_db
def test_beat_task_builds_the_configured_provider(
    rows: Rows, settings: Any, tmp_path: Path
) -> None:
    rows.region("us")
    history = [{"AvailabilityZone": "us-1a", "InstanceType": "p3.2xlarge", "SpotPrice": "0.8"}]
    (tmp_path / "p3.json").write_text(json.dumps({"SpotPriceHistory": history}))
    settings.MERIDIAN_CLOUD_PROVIDER = "static"
    settings.MERIDIAN_CLOUD_SPOT_PRICE_DATA = str(tmp_path)
    service()
    worker_provider.cache_clear()
    try:
        assert scale_services_task() == []
        assert worker_provider().zones() == [
            ZoneOffer("us-1a", "us", 0.8, settings.MERIDIAN_CLOUD_ON_DEMAND_PRICE)
        ]
    finally:
        worker_provider.cache_clear()
    assert not Replica.objects.exists()


@pytest.mark.django_db
def test_a_replica_that_is_not_ready_is_terminated_at_once_and_the_balancers_told(
    provider: MemoryProvider,
) -> None:
    launcher = ProviderLauncher(provider, service(), NOW)
    handle = launcher.launch(SPOT, "us-1a")
    assert handle is not None
    before = current_token()
    launcher.terminate(handle)
    row = Replica.objects.get(provider_handle=handle)
    assert (row.state, row.terminated_at) == (Replica.State.TERMINATED, NOW)
    assert handle not in provider.instances
    # The termination is a topology change: the balancers' next check reads it.
    assert current_token() != before
