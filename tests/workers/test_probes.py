from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleet.models import Event, Region, Replica, Zone
from workers.probes import probe_replicas
from workers.tasks import probe_replicas as probe_replicas_task


class _Health:
    status = 200


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(_Health.status if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def health_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Health.status = 200
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def replica(health_server: str) -> Replica:
    region = Region.objects.create(name="us-east")
    zone = Zone.objects.create(region=region, name="us-east-1a")
    return Replica.objects.create(
        name="r1",
        url=health_server,
        model_name="m",
        region=region,
        zone=zone,
        state=Replica.State.STARTING,
    )


@pytest.mark.django_db
def test_starting_replica_that_answers_becomes_ready(replica: Replica) -> None:
    transitions = probe_replicas()
    replica.refresh_from_db()
    assert replica.state == Replica.State.READY
    assert [(t.old_state, t.new_state) for t in transitions] == [("starting", "ready")]
    assert Event.objects.filter(kind="replica_ready", subject="r1").exists()
    assert probe_replicas() == []  # no transition, no duplicate event


@pytest.mark.django_db
def test_replica_fails_after_threshold_and_recovers(replica: Replica) -> None:
    probe_replicas()
    _Health.status = 503
    assert probe_replicas(failure_threshold=2) == []
    replica.refresh_from_db()
    assert (replica.state, replica.consecutive_failures) == (Replica.State.READY, 1)
    probe_replicas(failure_threshold=2)
    replica.refresh_from_db()
    assert replica.state == Replica.State.FAILED
    failed = Event.objects.get(kind="probe_failed")
    assert failed.severity == "warning" and "HTTP 503" in failed.message
    _Health.status = 200
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
def test_drained_replicas_are_left_alone(replica: Replica) -> None:
    Replica.objects.filter(id=replica.id).update(state=Replica.State.DRAINING)
    _Health.status = 503
    assert probe_replicas(failure_threshold=1) == []
    replica.refresh_from_db()
    assert replica.state == Replica.State.DRAINING


@pytest.mark.django_db
def test_celery_task_runs_the_same_service(replica: Replica) -> None:
    result = probe_replicas_task.apply().get()
    assert result == [{"replica": "r1", "old_state": "starting", "new_state": "ready"}]
