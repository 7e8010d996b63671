"""The live tick as beat runs it: ``publish_live_snapshot`` gathers the topology rows,
the heartbeats in Redis and each balancer's ``/internal/state``, and a staff socket
receives one aggregated snapshot through the real Redis channel layer."""

from __future__ import annotations

import time

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from console.live.tasks import publish_live_snapshot
from fleet.models import Balancer, Region, Replica, Zone
from meridian.asgi import application
from ops.embedded_redis import EmbeddedRedis
from routing.core.peers import Heartbeat, heartbeat_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def topology() -> None:
    region = Region.objects.create(name="lt", display_name="Live test")
    zone = Zone.objects.create(region=region, name="lt-1a")
    # Nothing listens on port 1: the balancer beats but does not answer.
    Balancer.objects.create(name="lt-lb", region=region, url="http://127.0.0.1:1", state="up")
    Replica.objects.create(
        name="lt-r1",
        url="http://127.0.0.1:1/r1",
        model_name="m",
        region=region,
        zone=zone,
        state=Replica.State.READY,
    )
    beat = Heartbeat("lt-lb", "lt", "http://127.0.0.1:1", time.time(), 1, 1, 0, 0)
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.set(heartbeat_key("lt-lb"), beat.to_json(), ex=30)
    client.close()


def staff_cookie() -> bytes:
    User.objects.create_user("ops", password="pw", is_staff=True)
    client = Client()
    client.login(username="ops", password="pw")
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def test_one_tick_reaches_the_console_as_one_snapshot(redis_server: EmbeddedRedis) -> None:
    await sync_to_async(topology)()
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    headers.append((b"cookie", await sync_to_async(staff_cookie)()))
    socket = WebsocketCommunicator(application, "/ws/live", headers=headers)
    connected, _ = await socket.connect()
    assert connected

    regions = await sync_to_async(publish_live_snapshot)()
    received = await socket.receive_json_from(timeout=5)
    await socket.disconnect()

    assert regions == 1 and received["kind"] == "snapshot"
    (region,) = received["regions"]
    assert (region["name"], region["display_name"], region["ready"]) == ("lt", "Live test", 1)
    (balancer,) = region["balancers"]
    assert balancer["up"] and not balancer["answering"]  # heartbeat fresh, no state
