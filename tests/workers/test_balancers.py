from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from core.peers import Heartbeat, heartbeat_key
from fleet.models import Balancer, Event, Region
from workers.balancers import sync_balancer_states


@pytest.fixture
def redis_client(redis_server) -> Iterator[redis.Redis]:  # type: ignore[no-untyped-def]
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.delete(heartbeat_key("test-sync-lb"))
    client.close()


def beat(ts: float) -> str:
    return Heartbeat(
        balancer="test-sync-lb",
        region="us-east",
        url="http://127.0.0.1:1",
        ts=ts,
        healthy_replicas=2,
        available_replicas=1,
        inflight=3,
        queue=0,
        models={"m": 1},
    ).to_json()


@pytest.mark.django_db
def test_balancer_goes_down_without_heartbeats_and_up_with_them(redis_client: redis.Redis) -> None:
    region = Region.objects.create(name="us-east")
    Balancer.objects.create(name="test-sync-lb", region=region, url="http://127.0.0.1:1")

    transitions = sync_balancer_states(redis_client, max_age_s=5)
    assert [(t.old_state, t.new_state) for t in transitions] == [("up", "down")]
    assert Event.objects.get(kind="balancer_down").severity == "error"

    redis_client.set(heartbeat_key("test-sync-lb"), beat(time.time()), ex=5)
    transitions = sync_balancer_states(redis_client, max_age_s=5)
    assert [(t.old_state, t.new_state) for t in transitions] == [("down", "up")]
    balancer = Balancer.objects.get()
    assert balancer.state == "up" and balancer.last_heartbeat is not None
    assert sync_balancer_states(redis_client, max_age_s=5) == []

    # A heartbeat that is present but stale counts as missing.
    redis_client.set(heartbeat_key("test-sync-lb"), beat(time.time() - 60), ex=5)
    assert sync_balancer_states(redis_client, max_age_s=5)[0].new_state == "down"


@pytest.mark.django_db
def test_corrupt_heartbeat_is_treated_as_missing(redis_client: redis.Redis) -> None:
    region = Region.objects.create(name="us-east")
    Balancer.objects.create(name="test-sync-lb", region=region, url="http://127.0.0.1:1")
    redis_client.set(heartbeat_key("test-sync-lb"), b"{not json", ex=5)
    assert sync_balancer_states(redis_client, max_age_s=5)[0].new_state == "down"


@pytest.mark.django_db
def test_down_event_names_the_last_heartbeat_seen(redis_client: redis.Redis) -> None:
    region = Region.objects.create(name="us-east")
    Balancer.objects.create(name="test-sync-lb", region=region, url="http://127.0.0.1:1")
    redis_client.set(heartbeat_key("test-sync-lb"), beat(time.time()), ex=5)
    sync_balancer_states(redis_client, max_age_s=5)
    seen = Balancer.objects.get().last_heartbeat
    redis_client.delete(heartbeat_key("test-sync-lb"))  # the key expired
    sync_balancer_states(redis_client, max_age_s=5)
    event = Event.objects.get(kind="balancer_down")
    assert seen is not None and event.data["last_heartbeat"] == seen.isoformat()
    assert seen.isoformat() in event.message
