"""Busy is not down, over real processes (``core.busy``): a replica whose status pages
answer late while it streams stays in routing and ``ready``; once it is quiet as well,
the balancer and the control plane both fail it.

One emulated replica (``python -m sim.serve``) in the ``busy`` fault, whose
``/health``, ``/metrics`` and ``/v1/models`` answer 2 s late while generation goes on,
as a saturated vLLM's API server does.  A daphne balancer probes it with a 0.5 s
timeout; the control plane's readiness probe (``workers.probes``, called as Celery
would) with a 1 s one.  Both time out on every probe.  What tells busy from down is
the traffic: the balancer hears the replica's streams, and its heartbeat marks the
replica as serving in Redis for the control plane.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from fleet.models import Event, Replica
from ops import http_probe
from ops.embedded_redis import EmbeddedRedis
from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    client,
    metric_value,
    start_balancer,
    state,
)
from tests.support.django_env import child_process_env
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port
from tests.support.sim_serve import serve_replicas
from workers.probes import probe_replicas

# The fleet's rows are committed (``django_db_blocker.unblock``): the balancer process
# reads them.
pytestmark = pytest.mark.integration

REPLICA = "busy-r1"
STATUS_LAG_S = 2.0
CONTROL_PLANE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class BusyFleet:
    balancer: str
    replica: str
    key: str


@pytest.fixture(scope="module")
def fleet(
    django_db_setup: None,
    django_db_blocker: Any,
    redis_server: EmbeddedRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BusyFleet]:
    group = ProcessGroup(tmp_path_factory.mktemp("busy-replica"))
    factory = TopologyFactory()
    with django_db_blocker.unblock():
        try:
            region = factory.region("busy")
            port, lb_port = free_port(), free_port()
            factory.replica(REPLICA, region, port)
            factory.balancer("busy-lb", region, lb_port)
            factory.service(policy="least_load")
            key = factory.api_key("busy")
            serve_replicas(group, "replicas-busy", {REPLICA: port}, model=MODEL)
            env = child_process_env(redis_server.url)
            url = start_balancer(group, env, "busy-lb", lb_port, MERIDIAN_PROBE_TIMEOUT_S="0.5")
            yield BusyFleet(url, f"http://127.0.0.1:{port}", key)
        finally:
            group.stop_all()
            factory.delete_all()
            Event.objects.all().delete()


def _row(fleet: BusyFleet) -> dict[str, Any]:
    return next(r for r in state(fleet.balancer)["replicas"] if r["name"] == REPLICA)


def _metric(fleet: BusyFleet, name: str) -> float:
    return metric_value(fleet.balancer, f'{name}{{replica="{REPLICA}"}}')


def _stream_until(fleet: BusyFleet, stop: threading.Event) -> int:
    """Streamed chats through the balancer, back to back, until ``stop``."""
    sdk, done = client(fleet.balancer, fleet.key), 0
    while not stop.is_set():
        chunks = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"keep streaming {done}"}],
            max_tokens=200,
            stream=True,
        )
        for _ in chunks:
            pass
        done += 1
    return done


# The test's own writes (the control plane's probes) stay in its transaction.
@pytest.mark.django_db
def test_a_busy_replica_stays_routed_and_ready_while_it_streams_and_fails_once_quiet(
    fleet: BusyFleet,
) -> None:
    answer = http_probe.post(
        f"{fleet.replica}/fault", json={"mode": "busy", "factor": STATUS_LAG_S}, timeout=5
    )
    assert answer.status_code == 200
    try:
        _busy_then_quiet(fleet)
    finally:
        http_probe.post(f"{fleet.replica}/fault", json={"mode": "none"}, timeout=5)


def _busy_then_quiet(fleet: BusyFleet) -> None:
    stop = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        streams = [pool.submit(_stream_until, fleet, stop) for _ in range(2)]
        try:
            eventually(
                lambda: _metric(fleet, "meridian_probe_late_total") >= 3,
                what="three late probes while the replica streams",
                timeout=30,
            )
            row = _row(fleet)
            assert row["healthy"] and row["late_probes"] >= 1
            assert _metric(fleet, "meridian_probe_failures_total") == 0
            # The control plane's probe times out too, and the heartbeat's mark excuses
            # it: past a threshold of 1, still ready.
            for _ in range(2):
                assert probe_replicas(timeout=CONTROL_PLANE_TIMEOUT_S, failure_threshold=1) == []
            replica = Replica.objects.get(name=REPLICA)
            assert (replica.state, replica.consecutive_failures) == ("ready", 0)
        finally:
            stop.set()
        assert all(future.result() >= 1 for future in streams)  # every stream finished

    # Quiet and still late: hung, as far as anyone can tell.
    eventually(lambda: not _row(fleet)["healthy"], what="the balancer fails it", timeout=30)
    assert _metric(fleet, "meridian_probe_failures_total") >= 2

    def failed_by_the_control_plane() -> bool:
        probe_replicas(timeout=CONTROL_PLANE_TIMEOUT_S, failure_threshold=1)
        return bool(Replica.objects.get(name=REPLICA).state == "failed")

    eventually(failed_by_the_control_plane, what="the control plane fails it", timeout=30)
    assert "ReadTimeout" in Event.objects.get(kind="probe_failed", subject=REPLICA).message
