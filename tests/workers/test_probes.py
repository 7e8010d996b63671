from __future__ import annotations

import pytest

from fleet.models import Event, Replica
from tests.support.http_server import FakeServer
from tests.support.rows import Rows
from workers.probes import probe_replicas
from workers.tasks import probe_replicas as probe_replicas_task


@pytest.fixture
def replica(rows: Rows, fake_server: FakeServer) -> Replica:
    fake_server.answer("GET", "/health", 200)
    region = rows.region("us-east")
    return rows.replica("r1", region, url=fake_server.url, state=Replica.State.STARTING)


@pytest.mark.django_db
def test_starting_replica_that_answers_becomes_ready(replica: Replica) -> None:
    transitions = probe_replicas()
    replica.refresh_from_db()
    assert replica.state == Replica.State.READY
    assert [(t.old_state, t.new_state) for t in transitions] == [("starting", "ready")]
    assert Event.objects.filter(kind="replica_ready", subject="r1").exists()
    assert probe_replicas() == []  # no transition, no duplicate event


@pytest.mark.django_db
def test_replica_fails_after_threshold_and_recovers(
    replica: Replica, fake_server: FakeServer
) -> None:
    probe_replicas()
    fake_server.answer("GET", "/health", 503)
    assert probe_replicas(failure_threshold=2) == []
    replica.refresh_from_db()
    assert (replica.state, replica.consecutive_failures) == (Replica.State.READY, 1)
    probe_replicas(failure_threshold=2)
    replica.refresh_from_db()
    assert replica.state == Replica.State.FAILED
    failed = Event.objects.get(kind="probe_failed")
    assert failed.severity == "warning" and "HTTP 503" in failed.message
    fake_server.answer("GET", "/health", 200)
    probe_replicas()
    replica.refresh_from_db()
    assert (replica.state, replica.consecutive_failures) == (Replica.State.READY, 0)
    assert Event.objects.filter(kind="replica_recovered").exists()


@pytest.mark.django_db
def test_unreachable_replica_counts_as_failure(replica: Replica) -> None:
    from tests.support.processes import free_port

    Replica.objects.filter(id=replica.id).update(url=f"http://127.0.0.1:{free_port()}")
    probe_replicas(failure_threshold=1)
    replica.refresh_from_db()
    assert replica.state == Replica.State.FAILED
    assert "ConnectError" in Event.objects.get(kind="probe_failed").data["detail"]


@pytest.mark.django_db
def test_drained_replicas_are_left_alone(replica: Replica, fake_server: FakeServer) -> None:
    Replica.objects.filter(id=replica.id).update(state=Replica.State.DRAINING)
    fake_server.answer("GET", "/health", 503)
    assert probe_replicas(failure_threshold=1) == []
    replica.refresh_from_db()
    assert replica.state == Replica.State.DRAINING


@pytest.mark.django_db
def test_celery_task_runs_the_same_service(replica: Replica) -> None:
    result = probe_replicas_task.apply().get()
    assert result == [{"replica": "r1", "old_state": "starting", "new_state": "ready"}]
