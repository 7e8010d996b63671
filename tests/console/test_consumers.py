"""The console's WebSocket through channels' ``WebsocketCommunicator`` against the real
ASGI application (origin check, session auth, Redis channel layer)."""

from __future__ import annotations

from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from console.live.messages import LIVE_GROUP, SNAPSHOT_TYPE, message
from fleet.models import Event
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


async def test_staff_receive_snapshots_and_events(redis_server: EmbeddedRedis) -> None:
    from asgiref.sync import sync_to_async

    cookie = await sync_to_async(_session_cookie)(staff=True)
    communicator = _socket(cookie)
    connected, _ = await communicator.connect()
    assert connected
    layer = get_channel_layer()
    snapshot = {"ts": 1.0, "regions": [{"name": "us-east", "rps": 3.5}], "replicas": []}
    await layer.group_send(LIVE_GROUP, message(SNAPSHOT_TYPE, snapshot))
    received = await communicator.receive_json_from(timeout=5)
    assert received["kind"] == "snapshot"
    assert received["regions"][0]["rps"] == 3.5

    # Recording an Event is enough: the post-save hook publishes it after commit.
    await sync_to_async(Event.record)("policy_changed", "m: a -> b", subject="m")
    received = await communicator.receive_json_from(timeout=5)
    assert received["kind"] == "event"
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
    connected, _ = await communicator.connect()
    assert not connected
