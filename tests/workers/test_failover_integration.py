"""Balancer failover over real processes (SkyLB §4.2): no request accepted after the
handover is lost, and the replicas go home when their balancer is back.

Two regions: ``fo-a`` (two replicas) and ``fo-b`` (one), a daphne balancer each,
real Redis heartbeats.  ``fo-a-lb`` is SIGKILLed; the control plane's own tasks,
called as functions (the heartbeat sync, then the failover controller), hand its
replicas to ``fo-b-lb``, which must then serve every request, some of them on the
dead region's replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from fleet.models import Balancer, Event, MetricRollup, Replica
from ops import http_probe
from ops.embedded_redis import EmbeddedRedis
from tests.support.balancers import MODEL, client
from tests.support.cluster import BALANCER_HEARTBEAT_TTL_S, Cluster, running_cluster
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup
from workers.balancers import sync_balancer_states
from workers.rollups import SCRAPE_KEY, rollup_metrics
from workers.tasks import failover_balancers

# Tests here commit what they write (``django_db_blocker.unblock``, no wrapping
# transaction): balancer processes must see the ownership the controller sets.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(
    django_db_setup: None,
    django_db_blocker: Any,
    redis_server: EmbeddedRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    group = ProcessGroup(tmp_path_factory.mktemp("failover"))
    with django_db_blocker.unblock():
        regions = {"fo-a": 2, "fo-b": 1}
        with running_cluster(group, redis_server.url, regions, {("fo-a", "fo-b"): 80}) as c:
            yield c


@pytest.fixture(scope="module")
def redis_client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.delete(*(SCRAPE_KEY.format(balancer=n) for n in ("fo-a-lb", "fo-b-lb")))
    client.close()


def sync_until(client: redis.Redis, name: str, state: str) -> None:
    """Run the heartbeat sync (as beat would) until ``name`` is in ``state``."""

    def synced() -> bool:
        sync_balancer_states(client, max_age_s=BALANCER_HEARTBEAT_TTL_S)
        return Balancer.objects.get(name=name).state == state

    eventually(synced, what=f"{name} {state}", timeout=20)


def complete(url: str, key: str, n: int) -> list[Any]:
    """``n`` concurrent completions; each returns its raw response (headers say who served)."""
    sdk = client(url, key)

    def one(i: int) -> Any:
        return sdk.completions.with_raw_response.create(
            model=MODEL, prompt=f"failover request {i}", max_tokens=4
        )

    with ThreadPoolExecutor(6) as pool:
        return list(pool.map(one, range(n)))


@pytest.mark.django_db  # read-only; also makes pytest-django create the test database
def test_each_balancer_starts_with_its_own_region(cluster: Cluster) -> None:
    for name, lb in cluster.balancers.items():
        own = set(Replica.objects.filter(region__name=lb.region).values_list("name", flat=True))
        cluster.wait_routed(name, own)
        assert cluster.routed_by(name) == own


def test_dead_balancers_replicas_serve_through_the_live_one_then_go_home(
    cluster: Cluster, redis_client: redis.Redis, django_db_blocker: Any
) -> None:
    a_replicas = set(cluster.region_replicas("fo-a"))
    b_url = cluster.balancers["fo-b-lb"].url
    with django_db_blocker.unblock():
        cluster.wait_routed("fo-a-lb", a_replicas)
        cluster.kill_balancer("fo-a-lb")
        sync_until(redis_client, "fo-a-lb", "down")
        moves = failover_balancers()
        assert {(m["replica"], m["to_owner"]) for m in moves} == {
            (name, "fo-b-lb") for name in a_replicas
        }
        assert Event.objects.filter(kind="failover", data__to_owner="fo-b-lb").exists()
        cluster.wait_routed("fo-b-lb", a_replicas)

        # Every request sent after the handover succeeds, on all three replicas.
        responses = complete(b_url, cluster.key, 12)
        assert all(r.http_response.status_code == 200 for r in responses)
        served = {r.headers["x-meridian-replica"] for r in responses}
        assert a_replicas <= served
        assert all(r.parse().choices for r in responses)

        # Clients of the dead region are told where to go.
        topology = http_probe.get(
            f"{b_url}/internal/topology", headers={"Authorization": f"Bearer {cluster.key}"}
        ).json()
        fo_a = next(r for r in topology["regions"] if r["name"] == "fo-a")
        assert (fo_a["serving_balancer"], fo_a["route"]) == ("fo-b-lb", "failover")

        # The balancer comes back: heartbeats resume and the replicas are handed back.
        cluster.start_balancer("fo-a-lb")
        sync_until(redis_client, "fo-a-lb", "up")
        moves = failover_balancers()
        assert {m["kind"] for m in moves} == {"failback"}
        assert set(
            Replica.objects.filter(region__name="fo-a").values_list("balancer", flat=True)
        ) == {None}
        cluster.wait_routed("fo-a-lb", a_replicas)
        eventually(lambda: not (cluster.routed_by("fo-b-lb") & a_replicas), what="fo-b gave back")
        assert cluster.routed_by("fo-a-lb") == a_replicas
        responses = complete(cluster.balancers["fo-a-lb"].url, cluster.key, 4)
        assert all(r.http_response.status_code == 200 for r in responses)


def test_rollups_count_the_live_balancers_traffic(
    cluster: Cluster, redis_client: redis.Redis, django_db_blocker: Any
) -> None:
    with django_db_blocker.unblock():
        sync_until(redis_client, "fo-b-lb", "up")
        rollup_metrics(redis_client)  # baseline
        sdk = client(cluster.balancers["fo-b-lb"].url, cluster.key)
        for i in range(5):  # streamed, so the balancer observes time to first token
            stream = sdk.completions.create(
                model=MODEL, prompt=f"rollup {i}", max_tokens=4, stream=True
            )
            assert "".join(c.choices[0].text for c in stream if c.choices)
        result = rollup_metrics(redis_client)
        assert "fo-b-lb" in result.scraped
        region = MetricRollup.objects.filter(scope="region", name="fo-b").latest("interval_end")
        assert region.requests == 5 and region.errors == 0
        assert region.completion_tokens > 0 and region.ttft_p50_s is not None
        replicas = MetricRollup.objects.filter(scope="replica", name="fo-b-r1")
        assert replicas.exists()
