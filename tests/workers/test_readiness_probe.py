"""Readiness by a real one-token completion (ServiceConfig.readiness_probe)."""

from __future__ import annotations

import json

import pytest

from fleet.models import Event, Replica, ServiceConfig
from tests.support.http_server import FakeServer
from tests.support.rows import Rows
from workers.probes import probe_replicas


@pytest.mark.django_db
def test_completion_probe_needs_a_generating_engine(rows: Rows, fake_server: FakeServer) -> None:
    ServiceConfig.objects.create(model_name="m", readiness_probe="completion")
    rows.replica("r1", rows.region("us"), url=fake_server.url, state=Replica.State.STARTING)
    # /health says fine, but the engine cannot complete: not ready.
    fake_server.answer("GET", "/health", 200)
    fake_server.answer("POST", "/v1/completions", 500, '{"error": "engine dead"}')
    assert probe_replicas(failure_threshold=1)[0].new_state == "failed"
    assert "completion HTTP 500" in Event.objects.get(kind="probe_failed").message

    fake_server.answer("POST", "/v1/completions", 200, '{"choices": []}')
    assert probe_replicas()[0].new_state == "ready"
    method, path, body = fake_server.requests[-1]
    assert (method, path) == ("POST", "/v1/completions")
    assert json.loads(body) == {"model": "m", "prompt": "ping", "max_tokens": 1, "stream": False}


@pytest.mark.django_db
def test_health_probe_is_the_default(rows: Rows, fake_server: FakeServer) -> None:
    rows.replica("r1", rows.region("us"), url=fake_server.url, state=Replica.State.STARTING)
    fake_server.answer("GET", "/health", 200)
    assert probe_replicas()[0].new_state == "ready"
    assert {(m, p) for m, p, _ in fake_server.requests} == {("GET", "/health")}
