"""The anti-entropy beat task's service function against fake balancers.

(The real thing, balancers syncing from emulated replicas, is exercised in
``tests/routing/test_kv_events_integration.py``.)
"""

from __future__ import annotations

import json

from django.conf import settings

from tests.support.http_server import FakeServer
from tests.support.rows import Rows
from workers.cache_sync import sync_cache_state
from workers.schedule import beat_schedule, expires_s
from workers.tasks import sync_cache_state as sync_cache_state_task


def test_every_live_balancer_is_asked_to_sync_with_the_token(
    rows: Rows, fake_server: FakeServer
) -> None:
    region = rows.region("cs")
    rows.balancer("cs-up", region, url=fake_server.url)
    rows.balancer("cs-dead", region, url="http://127.0.0.1:1", state="down")
    body = {"replicas": {"r1": {"blocks": 12, "error": None}}}
    fake_server.answer("POST", "/internal/cache_sync", 200, json.dumps(body))
    results = sync_cache_state(timeout=5)
    assert [(r.balancer, r.ok, r.replicas) for r in results] == [("cs-up", True, body["replicas"])]
    assert [(m, p) for m, p, _ in fake_server.requests] == [("POST", "/internal/cache_sync")]


def test_a_refusing_balancer_is_reported_not_raised(rows: Rows, fake_server: FakeServer) -> None:
    region = rows.region("cs")
    rows.balancer("cs-401", region, url=fake_server.url)
    rows.balancer("cs-gone", region, url="http://127.0.0.1:1")
    fake_server.answer("POST", "/internal/cache_sync", 401, "{}")
    results = {r.balancer: r for r in sync_cache_state(timeout=2)}
    assert not results["cs-401"].ok and "401" in results["cs-401"].detail
    assert not results["cs-gone"].ok and "ConnectError" in results["cs-gone"].detail


def test_the_beat_entry_is_scheduled_with_the_common_expiry() -> None:
    entry = beat_schedule()["sync-cache-state"]
    assert entry["task"] == sync_cache_state_task.name
    assert entry["schedule"] == settings.MERIDIAN_CACHE_SYNC_PERIOD_S
    assert entry["options"]["expires"] == expires_s(settings.MERIDIAN_CACHE_SYNC_PERIOD_S)
