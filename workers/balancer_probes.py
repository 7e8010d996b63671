"""Balancer health probes: GET every balancer's ``/health`` from the control plane.

Heartbeats (``workers.balancers``) say a balancer process is alive and talking to
Redis; this probe says whether it answers clients on the URL they use.  The two
disagree when Redis is partitioned from a healthy balancer (heartbeats stop, clients
are still served) or when a balancer beats but answers 503 (its topology cannot be
loaded, a background loop died).  ``Balancer.health`` records the probe's view:
``unhealthy`` after ``failure_threshold`` consecutive failures, ``healthy`` on the
first success; each transition is an Event.  Failover stays driven by heartbeats
(``Balancer.state``), as SkyLB's controller does; the health column is for operators.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
from django.db import transaction
from django.utils import timezone

from fleet.models import Balancer, Event
from workers.health import after_probe


@dataclass(frozen=True)
class BalancerProbeResult:
    balancer_id: int
    ok: bool
    detail: str


@dataclass(frozen=True)
class BalancerHealthTransition:
    balancer: str
    old_health: str
    new_health: str


async def _probe_one(client: httpx.AsyncClient, balancer_id: int, url: str) -> BalancerProbeResult:
    try:
        response = await client.get(url.rstrip("/") + "/health")
    except httpx.HTTPError as exc:
        return BalancerProbeResult(balancer_id, False, f"{type(exc).__name__}: {exc}")
    if response.status_code == 200:
        return BalancerProbeResult(balancer_id, True, "200")
    return BalancerProbeResult(balancer_id, False, f"HTTP {response.status_code}")


async def _probe_all(targets: list[tuple[int, str]], timeout: float) -> list[BalancerProbeResult]:
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        return await asyncio.gather(*(_probe_one(client, bid, url) for bid, url in targets))


def probe_balancers(
    *, timeout: float = 2.0, failure_threshold: int = 2
) -> list[BalancerHealthTransition]:
    """Probe every balancer once, concurrently, and record health transitions."""
    targets = list(Balancer.objects.values_list("id", "url"))
    if not targets:
        return []
    results = asyncio.run(_probe_all(targets, timeout))
    transitions = [_apply(result, failure_threshold) for result in results]
    return [t for t in transitions if t is not None]


def _apply(result: BalancerProbeResult, failure_threshold: int) -> BalancerHealthTransition | None:
    with transaction.atomic():
        balancer = Balancer.objects.select_for_update().filter(id=result.balancer_id).first()
        if balancer is None:
            return None  # deleted while we probed
        old = balancer.health
        balancer.last_probe_at = timezone.now()
        new, balancer.consecutive_failures = after_probe(
            result.ok,
            current=old,
            failures=balancer.consecutive_failures,
            threshold=failure_threshold,
            healthy=Balancer.Health.HEALTHY,
            unhealthy=Balancer.Health.UNHEALTHY,
        )
        balancer.health = new
        balancer.save(update_fields=["health", "last_probe_at", "consecutive_failures"])
        if new == old:
            return None
        _record(balancer, old, result)
        return BalancerHealthTransition(balancer.name, old, new)


def _record(balancer: Balancer, old: str, result: BalancerProbeResult) -> None:
    if balancer.health == Balancer.Health.HEALTHY:
        Event.record(
            "balancer_healthy",
            f"{balancer.name} answers /health",
            subject=balancer.name,
            previous=old,
        )
        return
    Event.record(
        "balancer_unhealthy",
        f"{balancer.name} failed {balancer.consecutive_failures} /health probes: {result.detail}",
        subject=balancer.name,
        severity=Event.Severity.ERROR,
        previous=old,
        detail=result.detail,
        url=balancer.url,
    )
