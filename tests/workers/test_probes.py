from __future__ import annotations

import pytest
import redis
from django.conf import settings

from core.peers import serving_key
from fleet.models import Event, Replica
from ops.embedded_redis import EmbeddedRedis
from tests.support.http_server import Canned, FakeServer
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


@pytest.mark.django_db
def test_a_timed_out_probe_of_a_replica_a_balancer_hears_from_is_late_not_failed(
    replica: Replica, fake_server: FakeServer, redis_server: EmbeddedRedis
) -> None:
    """A busy replica answers its readiness probe late; while a balancer marks it as
    serving (``core.busy``), the timeout neither fails it nor counts towards failing."""
    probe_replicas()  # ready
    fake_server.answer_in_turn("GET", "/health", Canned(200, delay_s=0.5))
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = serving_key(replica.name)
    client.set(key, "lb-us", px=60_000)
    try:
        for _ in range(3):  # past the threshold of 1
            assert probe_replicas(timeout=0.1, failure_threshold=1) == []
        replica.refresh_from_db()
        assert (replica.state, replica.consecutive_failures) == (Replica.State.READY, 0)
        assert replica.last_probe_at is not None
        assert not Event.objects.filter(kind="probe_failed").exists()

        client.delete(key)  # no balancer hears from it any more: a hung engine
        probe_replicas(timeout=0.1, failure_threshold=1)
        replica.refresh_from_db()
        assert replica.state == Replica.State.FAILED
        assert "ReadTimeout" in Event.objects.get(kind="probe_failed").data["detail"]
    finally:
        client.delete(key)
        client.close()


@pytest.mark.django_db
def test_a_serving_mark_does_not_excuse_an_error_status(
    replica: Replica, fake_server: FakeServer, redis_server: EmbeddedRedis
) -> None:
    probe_replicas()
    fake_server.answer("GET", "/health", 503)
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = serving_key(replica.name)
    client.set(key, "lb-us", px=60_000)
    try:
        probe_replicas(failure_threshold=1)
        replica.refresh_from_db()
        assert replica.state == Replica.State.FAILED  # an answer, and a bad one
    finally:
        client.delete(key)
        client.close()
