"""The Celery beat schedule: every periodic task, its period from settings, and the
one expiry rule.

Every entry expires (``EXPIRES_SHARE`` of its period, but never sooner than
``MIN_EXPIRES_S``): a worker that was away runs the fresh beat, not a backlog.  The
floor is there because the worker does control-plane work only, none of it with a
sub-second deadline: on a machine at load 20 a task can wait seconds to start, and a
sub-second expiry then revoked most runs unrun (failover included).  Every task reads
the current state when it runs, so a late run is still a right one.  The console's
live numbers do not go through Celery at all (``routing.live_publish``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

EXPIRES_SHARE = 0.8
MIN_EXPIRES_S = 10.0


def expires_s(period_s: float) -> float:
    return max(period_s * EXPIRES_SHARE, MIN_EXPIRES_S)


def every(task: str, period_s: float) -> dict[str, Any]:
    return {"task": task, "schedule": period_s, "options": {"expires": expires_s(period_s)}}


def _periods() -> dict[str, tuple[str, float]]:
    s = settings
    return {
        "probe-replicas": ("workers.tasks.probe_replicas", s.MERIDIAN_PROBE_PERIOD_S),
        "probe-balancers": ("workers.tasks.probe_balancers", s.MERIDIAN_BALANCER_PROBE_PERIOD_S),
        "sync-balancers": ("workers.tasks.sync_balancers", s.MERIDIAN_BALANCER_SYNC_PERIOD_S),
        "failover-balancers": ("workers.tasks.failover_balancers", s.MERIDIAN_FAILOVER_PERIOD_S),
        "rollup-metrics": ("workers.tasks.rollup_metrics", s.MERIDIAN_ROLLUP_PERIOD_S),
        "prune-rollups": ("workers.tasks.prune_rollups", s.MERIDIAN_ROLLUP_PRUNE_PERIOD_S),
        "rollup-key-usage": ("workers.tasks.rollup_key_usage", s.MERIDIAN_KEY_USAGE_PERIOD_S),
        "forecast-workload": ("workers.tasks.forecast_workload", s.MERIDIAN_FORECAST_PERIOD_S),
        "sync-cache-state": ("workers.tasks.sync_cache_state", s.MERIDIAN_CACHE_SYNC_PERIOD_S),
        "scale-services": ("workers.tasks.scale_services", s.MERIDIAN_SCALING_PERIOD_S),
    }


def beat_schedule() -> dict[str, dict[str, Any]]:
    return {entry: every(task, period) for entry, (task, period) in _periods().items()}
