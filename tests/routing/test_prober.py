"""The replica probe's ``/metrics`` GET through the relay's pool (``routing.prober``).

A balancer runtime probes loopback replicas (``tests.support.upstreams``) scripted to
answer ``/metrics`` well, with an error status, in another charset, or not at all.
"""

from __future__ import annotations

from typing import Any

import pytest

from routing.prober import _charset
from tests.support.loopback import Received, Reply
from tests.support.upstreams import Upstreams

pytestmark = pytest.mark.anyio


class ScriptedMetrics(Upstreams):
    """``/metrics`` answered with ``status`` in ``charset``; every GET recorded."""

    def __init__(self, status: int = 200, charset: str = "utf-8", **behaviour: str) -> None:
        super().__init__(**behaviour)
        self.status, self.charset = status, charset
        self.gets: list[Received] = []

    async def answer(self, request: Received) -> Reply:
        if request.method != "GET":
            return await super().answer(request)
        self.gets.append(request)
        text = "# HELP vllm:num_requests_running Requests running (é).\n"
        text += "vllm:num_requests_running 3\nvllm:num_requests_waiting 2\n"
        content_type = f"text/plain; version=0.0.4; charset={self.charset}"
        return Reply(self.status, [text.encode(self.charset)], content_type=content_type)


async def _probe(rt: Any, name: str) -> Any:
    target = rt.router.target(name)
    assert target is not None
    await rt.prober.probe(target)
    return target


async def test_a_probe_reads_the_gauges_and_asks_for_plain_bytes(build_runtime: Any) -> None:
    upstreams = ScriptedMetrics(charset="utf-16")
    rt = await build_runtime(upstreams, replicas=("a",))
    for _ in range(2):
        target = await _probe(rt, "a")
    assert (target.running, target.waiting) == (3, 2)
    assert rt.metrics.probe_failures.value("a") == 0
    for got in upstreams.gets:
        assert (got.method, got.path) == ("GET", "/metrics")
        assert got.headers["accept-encoding"] == "identity"
        assert "content-length" not in got.headers


@pytest.mark.parametrize(("status", "behaviour"), [(503, "ok"), (404, "ok"), (200, "refuse")])
async def test_a_probe_answered_outside_2xx_or_not_at_all_fails(
    build_runtime: Any, status: int, behaviour: str
) -> None:
    upstreams = ScriptedMetrics(status=status, a=behaviour)
    rt = await build_runtime(upstreams, replicas=("a",))
    await _probe(rt, "a")
    await _probe(rt, "a")
    assert rt.metrics.probe_failures.value("a") == 2


def test_the_charset_of_a_content_type() -> None:
    assert _charset("text/plain; version=0.0.4; charset=utf-8") == "utf-8"
    assert _charset('text/plain; charset="ISO-8859-1"') == "iso8859-1"
    assert _charset("text/plain; charset=no-such-codec") == "utf-8"
    assert _charset("text/plain") == "utf-8"
    assert _charset(None) == "utf-8"
