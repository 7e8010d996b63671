"""Celery beat schedule.  Periods come from settings; every entry expires before its
next run so a slow worker never piles probes up behind each other."""

from __future__ import annotations

from typing import Any

from django.conf import settings


def _every(task: str, period_s: float) -> dict[str, Any]:
    return {"task": task, "schedule": period_s, "options": {"expires": period_s * 0.8}}


def beat_schedule() -> dict[str, dict[str, Any]]:
    s = settings
    return {
        "probe-replicas": _every("workers.tasks.probe_replicas", s.MERIDIAN_PROBE_PERIOD_S),
        "probe-balancers": _every(
            "workers.tasks.probe_balancers", s.MERIDIAN_BALANCER_PROBE_PERIOD_S
        ),
        "sync-balancers": _every("workers.tasks.sync_balancers", s.MERIDIAN_BALANCER_SYNC_PERIOD_S),
        "failover-balancers": _every(
            "workers.tasks.failover_balancers", s.MERIDIAN_FAILOVER_PERIOD_S
        ),
        "rollup-metrics": _every("workers.tasks.rollup_metrics", s.MERIDIAN_ROLLUP_PERIOD_S),
        "prune-rollups": _every("workers.tasks.prune_rollups", s.MERIDIAN_ROLLUP_PRUNE_PERIOD_S),
        "sync-cache-state": _every(
            "workers.cache_sync.sync_cache_state", s.MERIDIAN_CACHE_SYNC_PERIOD_S
        ),
        "scale-services": _every(
            "workers.scaling_tasks.scale_services", s.MERIDIAN_SCALING_PERIOD_S
        ),
        "live-snapshot": _every("workers.live.publish_live_snapshot", s.MERIDIAN_LIVE_PERIOD_S),
    }
