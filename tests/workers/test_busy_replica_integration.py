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
    client,
    metric_value,
    state,
)
from tests.support.cluster import running_cluster
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup
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
    timeout = {"MERIDIAN_PROBE_TIMEOUT_S": "0.5"}
    with (
        django_db_blocker.unblock(),
        running_cluster(
            group, redis_server.url, {"busy": 1}, {}, policy="least_load", overrides=timeout
        ) as cluster,
    ):
        replica = Replica.objects.get(name=REPLICA).url
        yield BusyFleet(cluster.balancers["busy-lb"].url, replica, cluster.key)


def _row(fleet: BusyFleet) -> dict[str, Any]:
    return next(r for r in state(fleet.balancer)["replicas"] if r["name"] == REPLICA)


def _metric(fleet: BusyFleet, name: str) -> float:
    return metric_value(fleet.balancer, f'{name}{{replica="{REPLICA}"}}')


def _stream_until(fleet: BusyFleet, stop: threading.Event) -> int:
    """Streamed chats through the balancer, back to back, until ``stop``: the token
    chunks received."""
    sdk, tokens = client(fleet.balancer, fleet.key), 0
    while not stop.is_set():
        chunks = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"keep streaming {tokens}"}],
            max_tokens=200,
            stream=True,
        )
        tokens += sum(1 for chunk in chunks if chunk.choices)
    return tokens


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
        assert all(future.result() >= 1 for future in streams)  # tokens came throughout

    # Quiet and still late: hung, as far as anyone can tell.
    eventually(lambda: not _row(fleet)["healthy"], what="the balancer fails it", timeout=30)
    assert _metric(fleet, "meridian_probe_failures_total") >= 2

    def failed_by_the_control_plane() -> bool:
        probe_replicas(timeout=CONTROL_PLANE_TIMEOUT_S, failure_threshold=1)
        return bool(Replica.objects.get(name=REPLICA).state == "failed")

    eventually(failed_by_the_control_plane, what="the control plane fails it", timeout=30)
    assert "ReadTimeout" in Event.objects.get(kind="probe_failed", subject=REPLICA).message
