"""The console's WebSocket through channels' ``WebsocketCommunicator`` against the real
ASGI application (origin check, session auth, Redis channel layer, live streams)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from core.live_feed import FIELD, Counters, LiveRecord, stream_key
from fleet.models import Event, Region
from meridian.asgi import application
from ops.embedded_redis import EmbeddedRedis

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]
ORIGIN = (b"origin", b"http://127.0.0.1")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _session_cookie(*, staff: bool) -> bytes:
    user = User.objects.create_user("ops" if staff else "guest", password="pw", is_staff=staff)
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def _socket(cookie: bytes | None) -> WebsocketCommunicator:
    headers: list[tuple[bytes, bytes]] = [ORIGIN, (b"host", b"127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, "/ws/live", headers=headers)


async def _refused(communicator: WebsocketCommunicator) -> Any:
    connected, code = await communicator.connect()
    await communicator.disconnect()
    return connected, code


async def _next(communicator: WebsocketCommunicator, kind: str) -> Any:
    """The next message of ``kind`` (snapshots arrive every second in between)."""
    for _ in range(20):
        received = await communicator.receive_json_from(timeout=5)
        if received["kind"] == kind:
            return received
    raise AssertionError(f"no {kind} message")


def _balancer_sent_a_record(region: str) -> None:
    """What a balancer's live loop appends: 3 requests over its last second."""
    Region.objects.create(name=region)
    delta = Counters(requests=3, prompt_tokens=400, cached_tokens=100)
    record = LiveRecord(f"{region}-lb", region, time.time(), 1.0, delta)
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        client.delete(stream_key(region))
        client.xadd(stream_key(region), {FIELD: record.to_json()})


async def test_staff_receive_history_snapshots_and_events(redis_server: EmbeddedRedis) -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(_balancer_sent_a_record)("ws-test")
    cookie = await sync_to_async(_session_cookie)(staff=True)
    communicator = _socket(cookie)
    connected, _ = await communicator.connect()
    assert connected
    # The charts' back-fill comes first, read from the region's stream.
    received = await communicator.receive_json_from(timeout=5)
    assert received["kind"] == "history"
    assert received["regions"]["ws-test"]["rps"] == [3.0]
    received = await _next(communicator, "snapshot")
    region = received["regions"][0]
    assert (region["name"], region["rps"], region["hit_rate"]) == ("ws-test", 3.0, 0.25)

    # Recording an Event is enough: the post-save hook publishes it after commit.
    await sync_to_async(Event.record)("policy_changed", "m: a -> b", subject="m")
    received = await _next(communicator, "event")
    assert (received["event"]["kind"], received["event"]["message"]) == (
        "policy_changed",
        "m: a -> b",
    )
    await communicator.disconnect()


async def test_anonymous_and_non_staff_sockets_are_refused(redis_server: EmbeddedRedis) -> None:
    from asgiref.sync import sync_to_async

    assert await _refused(_socket(None)) == (False, 4403)
    cookie = await sync_to_async(_session_cookie)(staff=False)
    assert await _refused(_socket(cookie)) == (False, 4403)


async def test_a_foreign_origin_is_refused(redis_server: EmbeddedRedis) -> None:
    from asgiref.sync import sync_to_async

    cookie = await sync_to_async(_session_cookie)(staff=True)
    communicator = WebsocketCommunicator(
        application, "/ws/live", headers=[(b"origin", b"http://evil.example"), (b"cookie", cookie)]
    )
    # Disconnected like every refused socket, so the denier's channel-layer read ends.
    connected, _ = await _refused(communicator)
    assert not connected


async def test_a_drill_line_published_before_the_socket_joined_is_replayed(
    redis_server: EmbeddedRedis,
) -> None:
    """A drill started from the console publishes its first lines before the page its
    POST redirects to has connected; the socket replays them, numbered for the page
    to drop repeats."""
    from asgiref.sync import sync_to_async

    from console.live.publish import publish_drill

    line = {"run": "early", "drill": "drill_preempt", "t": 0.0, "text": "fault injected: x"}
    await sync_to_async(publish_drill)({**line, "done": False, "outcome": ""})
    cookie = await sync_to_async(_session_cookie)(staff=True)
    communicator = _socket(cookie)
    connected, _ = await communicator.connect()
    assert connected
    received = await _next(communicator, "drill")
    while received["run"] != "early":  # lines of drills that earlier tests published
        received = await _next(communicator, "drill")
    assert received["text"] == "fault injected: x"
    assert isinstance(received["seq"], int) and received["seq"] >= 1
    await communicator.disconnect()
