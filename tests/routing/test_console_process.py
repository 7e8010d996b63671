"""A process that plays no balancer (the console) refuses inference clearly."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
def console_process(settings: Any) -> None:
    settings.MERIDIAN_BALANCER = ""


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/models"])
async def test_v1_answers_503_not_a_balancer(
    console_process: None, async_client: Any, path: str
) -> None:
    if path == "/v1/models":
        response = await async_client.get(path)
    else:
        response = await async_client.post(
            path, data={"model": "m", "prompt": "hi"}, content_type="application/json"
        )
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "not_a_balancer" and error["type"] == "server_error"
    assert "not a balancer" in error["message"]


async def test_health_and_metrics_say_console(console_process: None, async_client: Any) -> None:
    health = await async_client.get("/health")
    assert health.status_code == 200 and health.json()["role"] == "console"
    metrics = await async_client.get("/metrics")
    assert metrics.status_code == 200
    assert b"meridian_balancer_process 0" in metrics.content


async def test_completions_only_accept_post(async_client: Any) -> None:
    response = await async_client.get("/v1/chat/completions")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert response["Allow"] == "POST"
