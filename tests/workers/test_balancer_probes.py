"""The control plane's own /health probe of balancers (separate from heartbeats)."""

from __future__ import annotations

import pytest

from fleet.models import Balancer, Event
from tests.support.http_server import FakeServer
from tests.support.rows import Rows
from workers.balancer_probes import probe_balancers
from workers.tasks import probe_balancers as probe_balancers_task


@pytest.mark.django_db
def test_unhealthy_after_threshold_and_healthy_again(rows: Rows, fake_server: FakeServer) -> None:
    rows.balancer("lb", rows.region("us"), url=fake_server.url)
    fake_server.answer("GET", "/health", 200)
    assert [(t.old_health, t.new_health) for t in probe_balancers()] == [("unknown", "healthy")]
    assert Event.objects.filter(kind="balancer_healthy", subject="lb").exists()

    fake_server.answer("GET", "/health", 503, '{"status": "degraded"}')
    assert probe_balancers(failure_threshold=2) == []
    transitions = probe_balancers(failure_threshold=2)
    assert [(t.old_health, t.new_health) for t in transitions] == [("healthy", "unhealthy")]
    event = Event.objects.get(kind="balancer_unhealthy")
    assert event.severity == "error" and event.data["detail"] == "HTTP 503"
    # The probe never touches the heartbeat-driven state that failover acts on.
    assert Balancer.objects.get().state == "up"

    fake_server.answer("GET", "/health", 200)
    assert probe_balancers()[0].new_health == "healthy"
    assert Balancer.objects.get().consecutive_failures == 0


@pytest.mark.django_db
def test_unreachable_balancer_through_the_task(rows: Rows) -> None:
    from tests.support.processes import free_port

    rows.balancer("lb", rows.region("us"), url=f"http://127.0.0.1:{free_port()}")
    for _ in range(2):
        result = probe_balancers_task.apply().get()
    assert result == [{"balancer": "lb", "old_health": "unknown", "new_health": "unhealthy"}]
    assert "ConnectError" in Event.objects.get(kind="balancer_unhealthy").data["detail"]
