"""Every Celery task of the control plane, registered in one place.

Tasks are thin: they take primitives, read their knobs from settings and call the
service function that does the work (the same one a management command or a test
calls).  All share one retry policy (``workers.task_policy.control_task``); their
beat entries, with the one expiry rule, are built in ``workers.schedule``.  The
console's live numbers need no task: balancers publish them to Redis themselves.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from celery.signals import worker_shutdown
from django.conf import settings

from workers.balancer_probes import probe_balancers as probe_balancers_service
from workers.balancers import sync_balancer_states
from workers.cache_sync import sync_cache_state as sync_cache_state_service
from workers.failover import reconcile_ownership
from workers.forecasting import ForecastSettings
from workers.forecasting import forecast_workload as forecast_workload_service
from workers.key_usage import rollup_key_usage as rollup_key_usage_service
from workers.probes import probe_replicas as probe_replicas_service
from workers.providers.base import CloudProvider
from workers.providers.factory import build_provider
from workers.rollups import prune_rollups as prune_rollups_service
from workers.rollups import rollup_metrics as rollup_metrics_service
from workers.scaling_glue import scale_services as scale_services_service
from workers.schedule import EXPIRES_SHARE
from workers.task_policy import control_task, redis_client


def _probe_timeout() -> float:
    return settings.MERIDIAN_PROBE_TIMEOUT_S * 2


@control_task()
def probe_replicas() -> list[dict[str, str]]:
    transitions = probe_replicas_service(
        timeout=_probe_timeout(), failure_threshold=settings.MERIDIAN_PROBE_FAILURE_THRESHOLD
    )
    return [t.__dict__ for t in transitions]


@control_task()
def probe_balancers() -> list[dict[str, str]]:
    transitions = probe_balancers_service(
        timeout=_probe_timeout(), failure_threshold=settings.MERIDIAN_PROBE_FAILURE_THRESHOLD
    )
    return [t.__dict__ for t in transitions]


@control_task()
def sync_balancers() -> list[dict[str, str]]:
    with redis_client() as client:
        transitions = sync_balancer_states(client, max_age_s=settings.MERIDIAN_HEARTBEAT_TTL_S)
    if transitions:
        # React to a death or a recovery now rather than at the controller's next beat.
        reconcile_ownership()
    return [t.__dict__ for t in transitions]


@control_task()
def failover_balancers() -> list[dict[str, str]]:
    return [move.__dict__ for move in reconcile_ownership()]


@control_task()
def rollup_metrics() -> dict[str, object]:
    with redis_client() as client:
        result = rollup_metrics_service(
            client, timeout=_probe_timeout(), period_s=settings.MERIDIAN_ROLLUP_PERIOD_S
        )
    return {
        "regions": len(result.regions),
        "replicas": len(result.replicas),
        "scraped": result.scraped,
        "failed": result.failed,
    }


@control_task()
def rollup_key_usage() -> dict[str, int]:
    with redis_client() as client:
        result = rollup_key_usage_service(client)
    return {"keys": result.keys, "updated": result.updated}


@control_task()
def prune_rollups() -> int:
    return prune_rollups_service(retention_s=settings.MERIDIAN_ROLLUP_RETENTION_S)


@control_task()
def forecast_workload() -> list[dict[str, object]]:
    """Refit (daily) or move on the token-density forecasts; store them for the console."""
    forecast_settings = ForecastSettings(
        window_s=settings.MERIDIAN_FORECAST_WINDOW_S,
        history_s=settings.MERIDIAN_FORECAST_HISTORY_S,
        retrain_s=settings.MERIDIAN_FORECAST_RETRAIN_S,
    )
    with redis_client() as client:
        results = forecast_workload_service(client, now=time.time(), settings=forecast_settings)
    return [r.__dict__ for r in results]


@control_task()
def sync_cache_state() -> list[dict[str, Any]]:
    """Anti-entropy: every live balancer re-reads its replicas' cache state now."""
    # Give up on a balancer before the next round is due.
    timeout = max(1.0, settings.MERIDIAN_CACHE_SYNC_PERIOD_S * EXPIRES_SHARE)
    return [r.__dict__ for r in sync_cache_state_service(timeout=timeout)]


@functools.cache
def worker_provider() -> CloudProvider:
    # One per worker process, kept: the emulated cloud's replica processes are this
    # process's children and its spot trace replays on this process's clock, so a
    # fresh provider per beat would orphan them.
    return build_provider()


@control_task()
def scale_services() -> list[dict[str, object]]:
    """Autoscaler and placement against the configured provider, every service."""
    return [d.__dict__ for d in scale_services_service(worker_provider())]


@worker_shutdown.connect
def close_provider(**_: object) -> None:
    # Emulated replicas run in their own sessions and would outlive the worker.
    if worker_provider.cache_info().currsize:
        worker_provider().close()
