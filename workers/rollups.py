"""Metric rollups: scrape every balancer, store interval rows, publish the latest.

Each pass GETs every balancer's ``/metrics`` (counters, gauges) and
``/internal/state`` (per-replica waiting and outstanding) concurrently, and
subtracts the counters kept in Redis from the previous pass
(``meridian:rollups:scrape:<balancer>``), so the database holds intervals, not
lifetime totals, and a worker restart loses nothing.  A balancer seen for the first
time only seeds its baseline.  The rows go to ``MetricRollup`` (history) and, per
region, to ``meridian:rollups:region:<region>`` (latest JSON, for live views) and
the ``meridian:rollups`` pub/sub channel.  ``prune_rollups`` bounds the history.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import redis
from django.db import transaction
from django.utils import timezone

from fleet.models import Balancer, MetricRollup
from routing.internal_auth import install_headers
from workers.promtext import Sample, counter_deltas, parse
from workers.rollup_math import (
    REPLICA_REQUESTS,
    BalancerInterval,
    RollupRow,
    region_rollups,
    replica_rollups,
)

logger = logging.getLogger(__name__)

SCRAPE_KEY = "meridian:rollups:scrape:{balancer}"
LATEST_KEY = "meridian:rollups:region:{region}"
CHANNEL = "meridian:rollups"
# A baseline older than this is from a previous life of the stack; start over.
BASELINE_TTL_S = 3600

COUNTERS = frozenset(
    {
        "meridian_requests_total",
        "meridian_prompt_tokens_total",
        "meridian_cached_prompt_tokens_total",
        "meridian_completion_tokens_total",
        "meridian_upstream_errors_total",
        "meridian_ttft_seconds_bucket",
    }
)
GAUGES = frozenset({"meridian_inflight_requests", "meridian_queue_length"})


@dataclass(frozen=True)
class Scrape:
    balancer: str
    region: str
    ts: float
    counters: dict[str, float]
    gauges: dict[str, float]
    replicas: list[dict[str, Any]]


@dataclass(frozen=True)
class RollupPass:
    regions: list[RollupRow]
    replicas: list[RollupRow]
    scraped: list[str]
    failed: dict[str, str]


def _scrape_from(
    balancer: Balancer, ts: float, samples: list[Sample], state: dict[str, Any]
) -> Scrape:
    counters = {s.key: s.value for s in samples if s.name in COUNTERS}
    gauges: dict[str, float] = {}
    for s in samples:
        if s.name in GAUGES:
            gauges[s.name] = gauges.get(s.name, 0.0) + s.value
    rows = [r for r in state.get("replicas") or [] if isinstance(r, dict)]
    for row in rows:
        counters[f"{REPLICA_REQUESTS}|replica={row.get('name')}"] = float(row.get("requests") or 0)
    return Scrape(balancer.name, balancer.region.name, ts, counters, gauges, rows)


async def _scrape_one(client: httpx.AsyncClient, balancer: Balancer) -> Scrape | str:
    base = balancer.url.rstrip("/")
    try:
        metrics, state = await asyncio.gather(
            client.get(base + "/metrics"), client.get(base + "/internal/state")
        )
        metrics.raise_for_status()
        state.raise_for_status()
        payload = state.json()
    except (httpx.HTTPError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    if not isinstance(payload, dict):
        return "/internal/state is not a JSON object"
    return _scrape_from(balancer, time.time(), parse(metrics.text), payload)


async def _scrape_all(balancers: list[Balancer], timeout: float) -> list[Scrape | str]:
    async with httpx.AsyncClient(
        timeout=timeout, trust_env=False, headers=install_headers()
    ) as client:
        return await asyncio.gather(*(_scrape_one(client, b) for b in balancers))


def _interval(client: redis.Redis, scrape: Scrape) -> BalancerInterval | None:
    """Deltas against the stored baseline (then store this scrape as the new one)."""
    key = SCRAPE_KEY.format(balancer=scrape.balancer)
    raw = client.get(key)
    baseline = {"ts": scrape.ts, "counters": scrape.counters}
    client.set(key, json.dumps(baseline), ex=BASELINE_TTL_S)
    if raw is None:
        return None
    try:
        previous = json.loads(raw)
        start, counters = float(previous["ts"]), dict(previous["counters"])
    except (ValueError, KeyError, TypeError):
        return None  # a corrupt baseline is no baseline: this scrape seeds a new one
    deltas = counter_deltas(counters, scrape.counters)
    return BalancerInterval(
        scrape.balancer, scrape.region, start, scrape.ts, deltas, scrape.gauges, scrape.replicas
    )


def _model(row: RollupRow) -> MetricRollup:
    values = row.as_dict()
    values["interval_start"] = datetime.fromtimestamp(row.interval_start, tz=UTC)
    values["interval_end"] = datetime.fromtimestamp(row.interval_end, tz=UTC)
    return MetricRollup(**values)


def _publish(
    client: redis.Redis,
    regions: list[RollupRow],
    replicas: list[RollupRow],
    replica_regions: dict[str, str],
    period_s: float,
) -> None:
    """Per region: its row and its replicas' rows (by the replica's own region, also
    while another region's balancer serves it after a failover)."""
    by_region: dict[str, list[dict[str, Any]]] = {r.name: [] for r in regions}
    for row in replicas:
        home = replica_regions.get(row.name, "")
        if home in by_region:
            by_region[home].append(row.as_dict())
    for region in regions:
        message = json.dumps({"region": region.as_dict(), "replicas": by_region[region.name]})
        # Kept a few periods so a live view sees "stale" rather than a wrong number.
        client.set(LATEST_KEY.format(region=region.name), message, ex=max(30, int(period_s * 6)))
        client.publish(CHANNEL, message)


def rollup_metrics(
    client: redis.Redis, *, timeout: float = 2.0, period_s: float = 10.0
) -> RollupPass:
    """One rollup pass over every balancer that is up."""
    balancers = list(Balancer.objects.filter(state=Balancer.State.UP).select_related("region"))
    results = asyncio.run(_scrape_all(balancers, timeout)) if balancers else []
    intervals, scraped, failed = [], [], {}
    for balancer, result in zip(balancers, results, strict=True):
        if isinstance(result, str):
            failed[balancer.name] = result
            continue
        scraped.append(balancer.name)
        interval = _interval(client, result)
        if interval is not None:
            intervals.append(interval)
    if failed:
        logger.warning("rollup scrape failed for %s", failed)
    regions, replicas = region_rollups(intervals), replica_rollups(intervals)
    with transaction.atomic():
        MetricRollup.objects.bulk_create([_model(r) for r in (*regions, *replicas)])
    replica_regions = {
        str(row.get("name")): str(row.get("region")) for i in intervals for row in i.replicas
    }
    _publish(client, regions, replicas, replica_regions, period_s)
    return RollupPass(regions, replicas, scraped, failed)


def prune_rollups(*, retention_s: float) -> int:
    """Delete rollups that ended more than ``retention_s`` ago; returns how many."""
    cutoff = timezone.now() - timedelta(seconds=retention_s)
    deleted, _ = MetricRollup.objects.filter(interval_end__lt=cutoff).delete()
    return deleted
