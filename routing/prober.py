"""The balancer's own sub-second replica probe (an asyncio task, not Celery).

Each round GETs every owned replica's ``/metrics`` concurrently on the shared
client, parses it with ``routing.core.engine_metrics`` and feeds the router:
running/waiting/KV usage for the policies, health for candidate filtering.
``MERIDIAN_PROBE_FAILURE_THRESHOLD`` consecutive failures make a replica
unhealthy; one success makes it healthy again (also after the proxy marked it
failed on a dispatch error, SkyServe's readiness-probe rule).  Celery's slower
probes feed the console and the database; this one feeds routing (DESIGN.md,
"The sub-second probe that selective pushing needs runs inside each balancer").
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from routing.core.engine_metrics import MetricsFormatError, parse_engine_load
from routing.core.router import LocalRouter
from routing.core.types import TargetState
from routing.telemetry import BalancerMetrics
from routing.upstream import join_url

logger = logging.getLogger(__name__)


class ReplicaProber:
    def __init__(
        self,
        client: httpx.AsyncClient,
        router: LocalRouter,
        metrics: BalancerMetrics,
        *,
        timeout_s: float,
        failure_threshold: int,
    ) -> None:
        self.client = client
        self.router = router
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.failure_threshold = failure_threshold

    async def probe_all(self) -> None:
        targets = self.router.targets()
        if targets:
            await asyncio.gather(*(self.probe(t) for t in targets))

    async def probe(self, target: TargetState) -> None:
        try:
            response = await self.client.get(
                join_url(target.url, "/metrics"), timeout=self.timeout_s
            )
            response.raise_for_status()
            load = parse_engine_load(response.text)
        except (httpx.HTTPError, MetricsFormatError) as exc:
            self.metrics.probe_failures.inc(target.target_id)
            if self.router.record_probe_failure(target.target_id, self.failure_threshold):
                logger.warning(
                    "replica %s unhealthy after probe failures: %s", target.target_id, exc
                )
            return
        was_healthy = target.healthy
        self.router.record_probe(target.target_id, load)
        if not was_healthy:
            logger.info("replica %s healthy again", target.target_id)
