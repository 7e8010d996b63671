"""The Redis-outage drill with two balancer processes per region (docs/scale-out.md).

Two regions of one replica each; each balancer is two uvicorn processes on one port
(``SO_REUSEPORT``) sharing in-flight counts and routes through a Redis of this
module's own (the drill pauses every client of it).  The drill must hear every
process of every balancer: each reports Redis down and its shared state degraded
(routing on its local view) within the bound, no request sent after that fails,
and afterwards each process is sharing with its sibling again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ops import http_probe
from ops.embedded_redis import EmbeddedRedis, ensure_redis
from tests.support.cluster import Cluster, running_cluster
from tests.support.drills import assert_drill_passed, run_drill
from tests.support.processes import ProcessGroup, free_port

# transaction=True: the drill issues its API key in this process; balancers must see it.
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    url = f"redis://127.0.0.1:{free_port()}/0"
    handle = ensure_redis(url, data_dir=tmp_path_factory.mktemp("drill-redis-n"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def cluster(
    django_db_setup: None,
    django_db_blocker: Any,
    own_redis: EmbeddedRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    group = ProcessGroup(tmp_path_factory.mktemp("drill-n"))
    regions = {"pn-a": 1, "pn-b": 1}
    with (
        django_db_blocker.unblock(),
        running_cluster(group, own_redis.url, regions, {("pn-a", "pn-b"): 60}, processes=2) as c,
    ):
        yield c


def test_redis_outage_drill_with_two_processes_per_region(
    cluster: Cluster, django_db_blocker: Any, settings: Any, own_redis: EmbeddedRedis
) -> None:
    settings.REDIS_URL = own_redis.url
    settings.MERIDIAN_AVAILABILITY_INTERVAL_S = 0.2
    settings.MERIDIAN_AVAILABILITY_TTL_S = 2.0
    settings.MERIDIAN_HEARTBEAT_INTERVAL_S = 0.2
    settings.MERIDIAN_BALANCER_SYNC_PERIOD_S = 0.5
    with django_db_blocker.unblock():
        text, run = run_drill(
            "drill_redis_outage", "--duration", "2", traffic=6, after_s=1, verbosity=2
        )
    assert_drill_passed(text, run)
    assert "state converged" in text and "(4 processes) report Redis down" in text
    assert run.failed_before == 0, text
    for lb in cluster.balancers.values():
        shared = http_probe.get(f"{lb.url}/health").json()["shared_state"]
        assert shared["degraded"] is False and shared["peers"] == 1
