"""The Celery beat schedule: every periodic task, its period from settings, and the
one expiry rule.

Every entry expires before its next run (``EXPIRES_SHARE`` of its period): a slow or
absent worker then drops a stale run instead of queueing it, so probes never pile up
behind each other and a worker that comes back runs the fresh beat, not a backlog.
Task names are strings the worker resolves, which is how the console's live tick is
scheduled here without the control plane importing the console.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

EXPIRES_SHARE = 0.8


def expires_s(period_s: float) -> float:
    return period_s * EXPIRES_SHARE


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
        "sync-cache-state": ("workers.tasks.sync_cache_state", s.MERIDIAN_CACHE_SYNC_PERIOD_S),
        "scale-services": ("workers.tasks.scale_services", s.MERIDIAN_SCALING_PERIOD_S),
        "live-snapshot": ("console.live.tasks.publish_live_snapshot", s.MERIDIAN_LIVE_PERIOD_S),
    }


def beat_schedule() -> dict[str, dict[str, Any]]:
    return {entry: every(task, period) for entry, (task, period) in _periods().items()}
