"""The drill commands against real processes, with a real Celery worker and beat.

Region ``dr-a`` has three replicas and ``dr-b`` one, a daphne balancer each.  A
``celery -A meridian worker --beat`` subprocess runs the control plane on its own
queue with fast periods (heartbeat sync every 0.5 s), so the kill-balancer drill's
failover is done by the real beat schedule, as under ``make run``.

Each drill runs through its management command with ``--traffic`` (the official
``openai`` client, retries on) and must pass: routing reacted within the bound the
configured periods give, and no request sent after the reaction failed.  Drills
break things for good, so they run in this order: slow (restored), preempt (one
replica gone), kill-balancer (``dr-a-lb`` gone).
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from fleet.models import Balancer, DrillRun, Event, Replica
from meridian.celery import app
from ops.embedded_redis import EmbeddedRedis
from tests.support.cluster import (
    BALANCER_HEARTBEAT_TTL_S,
    BALANCER_TOPOLOGY_REFRESH_S,
    Cluster,
    running_cluster,
)
from tests.support.drills import assert_drill_passed, run_drill
from tests.support.polling import log_shows
from tests.support.processes import ProcessGroup, wait_http
from workers.tasks import probe_balancers

# Tests commit what they write (see tests/workers/test_failover_integration.py).
pytestmark = pytest.mark.integration

QUEUE = f"drills-{uuid.uuid4().hex[:8]}"
WORKER_ENV = {
    "MERIDIAN_CELERY_QUEUE": QUEUE,
    "MERIDIAN_HEARTBEAT_TTL_S": str(BALANCER_HEARTBEAT_TTL_S),
    "MERIDIAN_BALANCER_SYNC_PERIOD_S": "0.5",
    "MERIDIAN_FAILOVER_PERIOD_S": "0.5",
    # Only what the drills need runs on its own; the rest is sent by the tests.
    "MERIDIAN_PROBE_PERIOD_S": "600",
    "MERIDIAN_BALANCER_PROBE_PERIOD_S": "600",
    "MERIDIAN_ROLLUP_PERIOD_S": "600",
}


@pytest.fixture(scope="module")
def cluster(
    django_db_setup: None,
    django_db_blocker: Any,
    redis_server: EmbeddedRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("drills")
    group = ProcessGroup(logs)
    regions = {"dr-a": 3, "dr-b": 1}
    with (
        django_db_blocker.unblock(),
        running_cluster(
            group, redis_server.url, regions, {("dr-a", "dr-b"): 80}, policy="least_load"
        ) as c,
    ):
        start_worker(c, logs)
        yield c


def start_worker(cluster: Cluster, logs: Path) -> None:
    argv = ["-m", "celery", "-A", "meridian", "worker", "--beat", "--pool", "solo"]
    argv += ["-Q", QUEUE, "--schedule", str(logs / "beat-schedule"), "--loglevel", "INFO"]
    process = cluster.group.python("celery", *argv, env={**cluster.env, **WORKER_ENV})
    log_shows(cluster.group, "celery", process, r"ready\.", timeout=60)


@pytest.fixture
def fast(settings: Any) -> None:
    """This process's settings as the balancers and the worker run (bounds use them)."""
    settings.MERIDIAN_TOPOLOGY_REFRESH_S = BALANCER_TOPOLOGY_REFRESH_S
    settings.MERIDIAN_HEARTBEAT_TTL_S = BALANCER_HEARTBEAT_TTL_S
    settings.MERIDIAN_BALANCER_SYNC_PERIOD_S = 0.5
    settings.MERIDIAN_PROBE_INTERVAL_S = 0.2


def drill(command: str, *args: str) -> tuple[str, DrillRun]:
    return run_drill(command, *args, traffic=8, after_s=1.5)


def assert_passed(text: str, run: DrillRun) -> None:
    assert_drill_passed(text, run)
    assert "outcome: passed" in text and "routing reacted after" in text


# First, and before any process starts: it runs in a test transaction (which, with
# SQLite's IMMEDIATE mode, holds the write lock), and it is what makes pytest-django
# create the test database for the module.
@pytest.mark.django_db
def test_drills_refuse_what_they_cannot_do() -> None:
    from fleet.models import Region, Zone

    region = Region.objects.create(name="dr-x")
    Zone.objects.create(region=region, name="dr-x-1")
    Balancer.objects.create(name="dr-x-lb", region=region, url="http://10.1.2.3:8101")
    cases = [
        (("drill_preempt", "--zone", "dr-x-1"), "no ready replica in zone 'dr-x-1'"),
        (("drill_kill_balancer", "--region", "nowhere"), "no region 'nowhere'"),
        (("drill_kill_balancer", "--region", "dr-x"), "not a loopback address"),
        (("drill_slow_replica", "--replica", "x", "--factor", "0.5"), "--factor must be above 1"),
        (("failover", "--from", "dr-x", "--to", "dr-x"), "same region"),
        (("drain_replica", "ghost"), "no replica named 'ghost'"),
    ]
    for args, message in cases:
        with pytest.raises(CommandError, match=message):
            call_command(*args, stdout=io.StringIO())
    assert not DrillRun.objects.exists()  # refused before anything was recorded or broken


def test_worker_runs_a_task_sent_with_delay(cluster: Cluster, django_db_blocker: Any) -> None:
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = QUEUE
    try:
        result = probe_balancers.delay().get(timeout=30)
    finally:
        app.conf.task_default_queue = previous
    assert {t["balancer"] for t in result} == {"dr-a-lb", "dr-b-lb"}
    with django_db_blocker.unblock():
        assert set(Balancer.objects.values_list("health", flat=True)) == {"healthy"}
        assert Event.objects.filter(kind="balancer_healthy").count() == 2


def test_slow_replica_drill(cluster: Cluster, django_db_blocker: Any, fast: None) -> None:
    with django_db_blocker.unblock():
        cluster.wait_routed("dr-a-lb", set(cluster.region_replicas("dr-a")))
        # dr-a-r1 is least-load's first choice on ties, so it keeps getting requests
        # until it is slow.  Slowed 1000x one request holds it for seconds and the next
        # ones go elsewhere: its share of the traffic falls, which the drill measures.
        # (At 50x a request took ~0.4 s and it still got a third of 8 req/s.)
        text, run = drill(
            "drill_slow_replica", "--replica", "dr-a-r1", "--factor", "1000", "--duration", "3"
        )
    assert_passed(text, run)
    assert run.kind == "slow-replica" and "fault cleared" in text
    assert run.failed_before == 0  # slow is not broken


def test_preempt_drill(cluster: Cluster, django_db_blocker: Any, fast: None) -> None:
    with django_db_blocker.unblock():
        text, run = drill("drill_preempt", "--replica", "dr-a-r3")
        assert_passed(text, run)
        assert Replica.objects.get(name="dr-a-r3").state == Replica.State.PREEMPTED
        assert Event.objects.filter(kind="replica_preempted", subject="dr-a-r3").exists()
    assert "dr-a-r3" not in cluster.routed_by("dr-a-lb")


def test_kill_balancer_drill(cluster: Cluster, django_db_blocker: Any, fast: None) -> None:
    with django_db_blocker.unblock():
        text, run = drill("drill_kill_balancer", "--region", "dr-a")
        assert_passed(text, run)
        assert Balancer.objects.get(name="dr-a-lb").state == Balancer.State.DOWN
        handed = Replica.objects.filter(region__name="dr-a", state=Replica.State.READY)
        assert {r.balancer.name for r in handed} == {"dr-b-lb"}
    assert f"clients now sent to {cluster.balancers['dr-b-lb'].url}" in text
    assert {"dr-a-r1", "dr-a-r2"} <= cluster.routed_by("dr-b-lb")
    with pytest.raises(OSError):
        wait_http(cluster.balancers["dr-a-lb"].url + "/health", timeout=0.5)
