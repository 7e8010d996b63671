"""Celery tasks: thin wrappers that take primitives and call plain service functions."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from workers.probes import probe_replicas as probe_replicas_service


@shared_task(
    autoretry_for=(OSError,),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=3,
)
def probe_replicas() -> list[dict[str, str]]:
    transitions = probe_replicas_service(
        timeout=settings.MERIDIAN_PROBE_TIMEOUT_S * 2,
        failure_threshold=settings.MERIDIAN_PROBE_FAILURE_THRESHOLD,
    )
    return [t.__dict__ for t in transitions]
