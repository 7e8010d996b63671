"""Send live messages from sync code (Celery tasks, views, drill threads, signals).

Publishing is best effort: the console is a view, so a Redis hiccup must never fail
the thing being observed (a probe, a drill step, a policy change).  Such failures are
logged, and the browser shows "stale" when messages stop.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models.signals import post_save

from console.live.messages import (
    DRILL_TYPE,
    DRILLS_GROUP,
    EVENT_TYPE,
    EVENTS_GROUP,
    DrillPayload,
    EventPayload,
    message,
)
from fleet.models import Event

logger = logging.getLogger(__name__)


def send(group: str, kind: str, payload: Any) -> bool:
    """``group_send`` one message; False (and a warning) when the layer is unreachable."""
    layer = get_channel_layer()
    if layer is None:
        return False
    # The channel layer has imported redis by now; importing it here rather than at the
    # top keeps it out of processes that never publish (this module is wired into every
    # process at start-up, each manage.py command included).
    import redis

    try:
        async_to_sync(layer.group_send)(group, message(kind, payload))
    except (OSError, redis.RedisError) as exc:
        logger.warning("live message to %s not sent: %s", group, exc)
        return False
    return True


def event_payload(event: Event) -> EventPayload:
    return {
        "id": event.pk,
        "created_at": event.created_at.isoformat(),
        "kind": event.kind,
        "severity": event.severity,
        "subject": event.subject,
        "message": event.message,
    }


def publish_event(event: Event) -> bool:
    return send(EVENTS_GROUP, EVENT_TYPE, event_payload(event))


# The drill lines this process published last.  A drill started from the console runs
# in the console's own process and its first lines (its bound, the fault injected) come
# within milliseconds of the POST, before the page the POST redirects to has opened its
# socket and joined the drills group; a socket replays these on connect
# (``recent_drill_lines``), and the page drops lines it has seen by ``seq``.
RECENT_DRILL_LINES = 200
_recent_drills: deque[DrillPayload] = deque(maxlen=RECENT_DRILL_LINES)
_drill_seq = itertools.count(1)
_drill_lock = threading.Lock()


def publish_drill(payload: DrillPayload) -> bool:
    with _drill_lock:  # drills run in threads: a line's number and place agree
        payload["seq"] = next(_drill_seq)
        _recent_drills.append(payload)
    return send(DRILLS_GROUP, DRILL_TYPE, payload)


def recent_drill_lines() -> list[DrillPayload]:
    with _drill_lock:
        return list(_recent_drills)


def _on_event_saved(sender: type[Event], instance: Event, created: bool, **kwargs: Any) -> None:
    if created:
        # After commit: a browser that reloads on the message must find the row, and an
        # Event recorded in a transaction that rolls back never happened.
        transaction.on_commit(lambda: publish_event(instance))


def connect_event_publishing() -> None:
    """Idempotent; called by every process that records Events (console, worker)."""
    post_save.connect(_on_event_saved, sender=Event, dispatch_uid="console.live.events")
