"""Celery task ``scale_services``: the autoscaler and placement against the provider.

The provider is built once per worker process and kept: the emulated cloud's replica
processes are this process's children and its spot trace replays on this process's
clock, so a fresh provider per beat would orphan them.
"""

from __future__ import annotations

import functools

from celery import shared_task
from celery.signals import worker_shutdown

from workers.providers.base import CloudProvider
from workers.providers.factory import build_provider
from workers.scaling_glue import scale_services as scale_services_service


@functools.cache
def worker_provider() -> CloudProvider:
    return build_provider()


@shared_task(autoretry_for=(OSError,), retry_backoff=True, retry_jitter=True, max_retries=3)
def scale_services() -> list[dict[str, object]]:
    return [d.__dict__ for d in scale_services_service(worker_provider())]


@worker_shutdown.connect
def close_provider(**_: object) -> None:
    # Emulated replicas run in their own sessions and would outlive the worker.
    if worker_provider.cache_info().currsize:
        worker_provider().close()
