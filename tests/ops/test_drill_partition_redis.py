"""The partition and Redis-outage drills against real processes.

Two regions (``pr-a``, ``pr-b``) of one replica and one daphne balancer each, on a
Redis of this module's own: the outage drill pauses every client of the Redis it
is given, and a Redis shared with other test sessions must not stall.  Each drill
runs through its management command with ``--traffic`` (the official ``openai``
client, retries on) and must pass: both sides saw the fault within the bound the
configured periods give, no request sent after that failed, and the state
converged once the fault ended.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from fleet.models import Balancer, DrillRun
from ops.drills import redis_outage
from ops.drills.redis_outage import pause_command
from ops.embedded_redis import EmbeddedRedis, ensure_redis
from tests.support.balancers import state
from tests.support.cluster import Cluster, running_cluster
from tests.support.drills import assert_drill_passed, run_drill
from tests.support.processes import ProcessGroup, free_port

pytestmark = pytest.mark.integration


@pytest.mark.django_db
def test_the_drills_refuse_what_they_cannot_do(settings: Any) -> None:
    from fleet.models import Region

    Region.objects.create(name="pr-x")
    cases = [
        (("drill_partition", "--between", "pr-x", "pr-x"), "two different regions"),
        (("drill_partition", "--between", "pr-x", "nowhere"), "no live balancer to partition"),
        (("drill_redis_outage", "--duration", "9999"), "--duration must be in"),
    ]
    settings.REDIS_URL = "redis://10.1.2.3:6379/0"
    cases.append((("drill_redis_outage", "--duration", "1"), "not a loopback address"))
    for args, message in cases:
        with pytest.raises(CommandError, match=message):
            call_command(*args, stdout=io.StringIO())
    assert not DrillRun.objects.exists()


def test_a_process_that_has_not_met_its_sibling_does_not_shrink_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fresh connections land on the laggard (no sibling yet) and on the one that knows.
    answers = iter(
        [{"shared_state": {"process": "p1", "peers": 0}}] * 5
        + [{"shared_state": {"process": "p2", "peers": 1}}] * 7
    )
    monkeypatch.setattr(redis_outage, "redis_view", lambda url: next(answers))
    counts = redis_outage.process_counts([Balancer(name="lb", url="http://127.0.0.1:1")])
    assert counts == {"lb": 2}


def test_pause_uses_the_all_mode_where_redis_has_it() -> None:
    assert pause_command("7.0.15", 2000) == ["CLIENT", "PAUSE", 2000, "ALL"]
    assert pause_command("6.0.9", 500) == ["CLIENT", "PAUSE", 500]


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    url = f"redis://127.0.0.1:{free_port()}/0"
    handle = ensure_redis(url, data_dir=tmp_path_factory.mktemp("drill-redis"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def cluster(
    django_db_setup: None,
    django_db_blocker: Any,
    own_redis: EmbeddedRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    group = ProcessGroup(tmp_path_factory.mktemp("drill-pr"))
    regions = {"pr-a": 1, "pr-b": 1}
    with (
        django_db_blocker.unblock(),
        running_cluster(group, own_redis.url, regions, {("pr-a", "pr-b"): 60}) as c,
    ):
        yield c


@pytest.fixture
def fast(settings: Any, own_redis: EmbeddedRedis) -> None:
    """This process's settings as ``start_balancer`` runs the balancers (bounds use them)."""
    settings.REDIS_URL = own_redis.url
    settings.MERIDIAN_AVAILABILITY_INTERVAL_S = 0.2
    settings.MERIDIAN_AVAILABILITY_TTL_S = 2.0
    settings.MERIDIAN_HEARTBEAT_INTERVAL_S = 0.2
    settings.MERIDIAN_BALANCER_SYNC_PERIOD_S = 0.5


def drill(command: str, *args: str) -> tuple[str, DrillRun]:
    return run_drill(command, *args, traffic=6, after_s=1, verbosity=2)


def assert_converged(text: str, run: DrillRun) -> None:
    assert_drill_passed(text, run)
    assert "state converged" in text and "fault cleared" in text


def all_peers_alive(cluster: Cluster) -> bool:
    return all(all(p["alive"] for p in state(lb.url)["peers"]) for lb in cluster.balancers.values())


def test_partition_drill(cluster: Cluster, django_db_blocker: Any, fast: None) -> None:
    with django_db_blocker.unblock():
        text, run = drill("drill_partition", "--between", "pr-a", "pr-b", "--duration", "2")
    assert_converged(text, run)
    assert run.kind == "partition" and "balancer links cut off" in text
    assert all_peers_alive(cluster)
    assert all(state(lb.url)["faults"]["partition"] == [] for lb in cluster.balancers.values())


def test_redis_outage_drill(cluster: Cluster, django_db_blocker: Any, fast: None) -> None:
    with django_db_blocker.unblock():
        text, run = drill("drill_redis_outage", "--duration", "2")
    assert_converged(text, run)
    assert run.kind == "redis-outage" and "CLIENT PAUSE 2000 ALL" in text
    assert run.failed_before == 0  # routing never needed Redis
    for lb in cluster.balancers.values():
        redis_view = state(lb.url)["redis"]
        assert redis_view["connected"] and redis_view["heartbeats"]
