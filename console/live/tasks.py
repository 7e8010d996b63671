"""The console's one Celery task: the live tick, registered through the control
plane's task policy (``workers.task_policy``) and scheduled with every other beat
entry in ``workers.schedule`` (as ``live-snapshot``)."""

from __future__ import annotations

from django.conf import settings

from console.live.tick import publish_live
from workers.task_policy import control_task, redis_client


# A result per tick would only fill the result backend: nobody waits on it.
@control_task(ignore_result=True)
def publish_live_snapshot() -> int:
    """One snapshot to the live group; returns how many regions it held."""
    with redis_client() as client:
        snapshot = publish_live(client, timeout=settings.MERIDIAN_LIVE_STATE_TIMEOUT_S)
    return len(snapshot["regions"])
