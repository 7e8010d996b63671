"""Celery tasks: thin wrappers that take primitives and call plain service functions."""

from __future__ import annotations

import redis
from celery import shared_task
from django.conf import settings

from workers.balancers import sync_balancer_states
from workers.probes import probe_replicas as probe_replicas_service

_RETRY = {
    "autoretry_for": (OSError, redis.ConnectionError),
    "retry_backoff": True,
    "retry_jitter": True,
    "max_retries": 3,
}


@shared_task(**_RETRY)
def probe_replicas() -> list[dict[str, str]]:
    transitions = probe_replicas_service(
        timeout=settings.MERIDIAN_PROBE_TIMEOUT_S * 2,
        failure_threshold=settings.MERIDIAN_PROBE_FAILURE_THRESHOLD,
    )
    return [t.__dict__ for t in transitions]


@shared_task(**_RETRY)
def sync_balancers() -> list[dict[str, str]]:
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        transitions = sync_balancer_states(client, max_age_s=settings.MERIDIAN_HEARTBEAT_TTL_S)
    finally:
        client.close()
    return [t.__dict__ for t in transitions]
