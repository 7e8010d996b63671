"""Celery tasks: thin wrappers that take primitives and call plain service functions.

Every task retries on connection trouble (Redis, a socket) with exponential backoff
and jitter; beat entries expire before their next run (``workers.schedule``), so a
backlog never piles probes up behind each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from celery import shared_task
from django.conf import settings

from workers.balancer_probes import probe_balancers as probe_balancers_service
from workers.balancers import sync_balancer_states
from workers.cache_sync import sync_cache_state_task  # noqa: F401  (anti-entropy beat task)
from workers.failover import reconcile_ownership
from workers.live import publish_live_snapshot  # noqa: F401  (console live snapshot task)
from workers.probes import probe_replicas as probe_replicas_service
from workers.rollups import prune_rollups as prune_rollups_service
from workers.rollups import rollup_metrics as rollup_metrics_service
from workers.scaling_tasks import scale_services  # noqa: F401  (scaling beat task)

_RETRY = {
    "autoretry_for": (OSError, redis.ConnectionError),
    "retry_backoff": True,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": 3,
}


@contextmanager
def _redis() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        yield client
    finally:
        client.close()


@shared_task(**_RETRY)
def probe_replicas() -> list[dict[str, str]]:
    transitions = probe_replicas_service(
        timeout=settings.MERIDIAN_PROBE_TIMEOUT_S * 2,
        failure_threshold=settings.MERIDIAN_PROBE_FAILURE_THRESHOLD,
    )
    return [t.__dict__ for t in transitions]


@shared_task(**_RETRY)
def probe_balancers() -> list[dict[str, str]]:
    transitions = probe_balancers_service(
        timeout=settings.MERIDIAN_PROBE_TIMEOUT_S * 2,
        failure_threshold=settings.MERIDIAN_PROBE_FAILURE_THRESHOLD,
    )
    return [t.__dict__ for t in transitions]


@shared_task(**_RETRY)
def sync_balancers() -> list[dict[str, str]]:
    with _redis() as client:
        transitions = sync_balancer_states(client, max_age_s=settings.MERIDIAN_HEARTBEAT_TTL_S)
    if transitions:
        # React to a death or a recovery now rather than at the controller's next beat.
        reconcile_ownership()
    return [t.__dict__ for t in transitions]


@shared_task(**_RETRY)
def failover_balancers() -> list[dict[str, str]]:
    return [move.__dict__ for move in reconcile_ownership()]


@shared_task(**_RETRY)
def rollup_metrics() -> dict[str, object]:
    with _redis() as client:
        result = rollup_metrics_service(
            client,
            timeout=settings.MERIDIAN_PROBE_TIMEOUT_S * 2,
            period_s=settings.MERIDIAN_ROLLUP_PERIOD_S,
        )
    return {
        "regions": len(result.regions),
        "replicas": len(result.replicas),
        "scraped": result.scraped,
        "failed": result.failed,
    }


@shared_task(**_RETRY)
def prune_rollups() -> int:
    return prune_rollups_service(retention_s=settings.MERIDIAN_ROLLUP_RETENTION_S)
