"""Anti-entropy on Celery beat: every balancer replaces its cache maps by the replicas'
authoritative state (002 §4.4, destructive per-replica sync through the reverse index).

KV events keep a balancer's cache map current between syncs, but PUB sockets drop
messages silently under pressure and a balancer that (re)starts or adopts replicas
after a failover has heard nothing yet.  Every ``MERIDIAN_CACHE_SYNC_PERIOD_S`` the
task ``workers.tasks.sync_cache_state`` POSTs each balancer's ``/internal/cache_sync``
(``Authorization: Bearer MERIDIAN_INTERNAL_TOKEN``); the balancer fetches each
owned replica's ``GET /kv_cache/blocks`` and calls ``CacheMap.sync``.  The work is
done where the map lives; the task only says when (the balancer already knows
which replicas it owns and which services route by ``cache_map``).

A balancer that does not answer is reported, not retried: the next beat comes soon
and the entry expires before it, so syncs never pile up.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings

from fleet.models import Balancer

SYNC_PATH = "/internal/cache_sync"


@dataclass(frozen=True)
class BalancerSync:
    balancer: str
    ok: bool
    detail: str
    replicas: dict[str, Any] = field(default_factory=dict)


async def _sync_one(client: httpx.AsyncClient, name: str, url: str, token: str) -> BalancerSync:
    try:
        response = await client.post(
            url.rstrip("/") + SYNC_PATH, headers={"Authorization": f"Bearer {token}"}
        )
        response.raise_for_status()
        replicas = response.json().get("replicas", {})
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return BalancerSync(name, False, f"{type(exc).__name__}: {exc}")
    return BalancerSync(name, True, f"{len(replicas)} replicas", replicas)


async def _sync_all(targets: list[tuple[str, str]], token: str, timeout: float) -> list[Any]:
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        return list(
            await asyncio.gather(*(_sync_one(client, name, url, token) for name, url in targets))
        )


def sync_cache_state(*, timeout: float = 5.0) -> list[BalancerSync]:
    """Ask every live balancer to sync its cache maps now, concurrently."""
    targets = list(Balancer.objects.exclude(state=Balancer.State.DOWN).values_list("name", "url"))
    if not targets:
        return []
    return asyncio.run(_sync_all(targets, settings.MERIDIAN_INTERNAL_TOKEN, timeout))
