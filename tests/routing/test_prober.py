"""The balancer's sub-second probe against real loopback replicas: what a good
``/metrics`` page, an error status and a refused connection each do to routing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.loopback import Received, Reply
from tests.support.upstreams import Upstreams

pytestmark = pytest.mark.anyio


class MetricsStatus(Upstreams):
    """``/metrics`` of the replicas in ``failing`` answers with that status."""

    def __init__(self, **behaviour: str) -> None:
        super().__init__(**behaviour)
        self.failing: dict[str, int] = {}

    async def answer(self, request: Received) -> Reply:
        status = self.failing.get(request.server)
        if status and request.method == "GET" and request.path == "/metrics":
            return Reply(status, [b"busy"], content_type="text/plain")
        return await super().answer(request)


async def test_probes_record_load_and_count_failures_to_the_threshold(
    build_runtime: Any,
) -> None:
    upstreams = MetricsStatus(c="refuse")
    upstreams.running["a"], upstreams.waiting["a"] = 3, 2
    upstreams.failing["b"] = 503
    rt = await build_runtime(upstreams, replicas=("a", "b", "c"))  # failure threshold 2
    for _ in range(2):  # the second round reuses the first round's connections
        await rt.prober.probe_all()
        a = rt.router.target("a")
        assert a is not None and (a.running, a.waiting, a.healthy) == (3, 2, True)
    for name in ("b", "c"):
        target = rt.router.target(name)
        assert target is not None and not target.healthy
    assert [rt.metrics.probe_failures.value(n) for n in ("a", "b", "c")] == [0, 2, 2]
    upstreams.failing.clear()  # b's page recovers: after the breaker's hold-down
    await rt.prober.probe_all()  # (longer than this test) it takes good probes to readmit
    b = rt.router.target("b")
    assert b is not None and not b.healthy
