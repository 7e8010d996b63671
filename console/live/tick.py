"""One live tick: gather what the control plane can see, aggregate it, send it once.

Each tick (the Celery task ``console.live.tasks.publish_live_snapshot``) reads every
balancer's ``GET /internal/state`` concurrently with a short timeout (a dead balancer
costs one timeout, not a stalled tick), the heartbeats and the latest region rollups
from Redis, and the topology rows; ``snapshot`` turns them into per-region numbers,
and the result goes to the ``console.live`` group once.  The previous tick's counter
totals live in Redis so rates survive worker restarts and any worker may run the next
tick.  The beat entry's ``expires`` is shorter than its period, so a slow tick is
dropped rather than queued.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import redis
from django.conf import settings
from django.utils import timezone

from console.live.messages import LIVE_GROUP, SNAPSHOT_TYPE
from console.live.publish import send
from console.live.snapshot import BalancerRow, ReplicaRow, TickInputs, build_snapshot
from fleet.models import Balancer, Region, Replica
from routing.core.peers import Heartbeat, heartbeat_key
from routing.internal_auth import install_headers
from workers.cost import hourly_cost_by_region
from workers.rollups import LATEST_KEY

PREVIOUS_KEY = "meridian:live:previous"
# Each replica's warnings from the latest tick, for pages rendered before the first
# live message arrives (the replicas page); kept a minute, like the counters.
WARNINGS_KEY = "meridian:live:replica_warnings"


async def _fetch_one(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    try:
        response = await client.get(url.rstrip("/") + "/internal/state")
        response.raise_for_status()
        data: dict[str, Any] = response.json()
    except (httpx.HTTPError, ValueError):
        return None  # shown as "not answering"; the heartbeat says whether it lives
    return data


async def _fetch_states(
    balancers: list[BalancerRow], timeout: float
) -> list[dict[str, Any] | None]:
    async with httpx.AsyncClient(
        timeout=timeout, trust_env=False, headers=install_headers()
    ) as client:
        return await asyncio.gather(*(_fetch_one(client, b.url) for b in balancers))


def _heartbeats(client: redis.Redis, names: list[str]) -> dict[str, float | None]:
    raw = client.mget([heartbeat_key(n) for n in names]) if names else []
    beats: dict[str, float | None] = {}
    for name, value in zip(names, raw, strict=True):
        try:
            beats[name] = Heartbeat.from_json(value).ts if value else None
        except ValueError:
            beats[name] = None
    return beats


def _rollups(client: redis.Redis, regions: list[str]) -> dict[str, dict[str, Any] | None]:
    raw = client.mget([LATEST_KEY.format(region=r) for r in regions]) if regions else []
    return {r: (json.loads(v)["region"] if v else None) for r, v in zip(regions, raw, strict=True)}


def topology_rows() -> tuple[list[tuple[str, str]], list[BalancerRow], list[ReplicaRow]]:
    regions = [(r.name, r.display_name) for r in Region.objects.all()]
    balancers = [
        BalancerRow(b.name, b.region.name, b.url, b.state)
        for b in Balancer.objects.select_related("region")
    ]
    replicas = [
        ReplicaRow(
            r.name,
            r.region.name,
            r.zone.name,
            r.kind,
            r.state,
            r.balancer.name if r.balancer else None,
        )
        for r in Replica.objects.select_related("region", "zone", "balancer")
    ]
    return regions, balancers, replicas


def gather_inputs(client: redis.Redis, *, timeout: float) -> TickInputs:
    regions, balancers, replicas = topology_rows()
    states = asyncio.run(_fetch_states(balancers, timeout)) if balancers else []
    previous = client.get(PREVIOUS_KEY)
    return TickInputs(
        now=time.time(),
        regions=regions,
        balancers=balancers,
        replicas=replicas,
        states={b.name: s for b, s in zip(balancers, states, strict=True)},
        heartbeats=_heartbeats(client, [b.name for b in balancers]),
        rollups=_rollups(client, [name for name, _ in regions]),
        previous=json.loads(previous) if previous else {},
        heartbeat_ttl_s=settings.MERIDIAN_HEARTBEAT_TTL_S,
        hourly_cost={
            region: float(rate) for region, rate in hourly_cost_by_region(timezone.now()).items()
        },
    )


def publish_live(client: redis.Redis, *, timeout: float) -> dict[str, Any]:
    """Build this tick's snapshot, remember its counters, send it; returns it."""
    snapshot, totals = build_snapshot(gather_inputs(client, timeout=timeout))
    client.set(PREVIOUS_KEY, json.dumps(totals), ex=60)
    store_warnings(client, snapshot["replicas"])
    send(LIVE_GROUP, SNAPSHOT_TYPE, snapshot)
    return snapshot


def store_warnings(client: redis.Redis, replicas: list[dict[str, Any]]) -> None:
    warnings = {r["name"]: r["warnings"] for r in replicas if r.get("warnings")}
    client.set(WARNINGS_KEY, json.dumps(warnings), ex=60)


def latest_warnings(client: redis.Redis) -> dict[str, list[dict[str, str]]]:
    """Replica name -> its warnings at the latest tick ({} when none is recent)."""
    raw = client.get(WARNINGS_KEY)
    warnings: dict[str, list[dict[str, str]]] = json.loads(raw) if raw else {}
    return warnings
