"""Group names and message payloads of the console's live transport.

Every message a consumer receives is ``{"type": <handler>, "payload": {...}}``; the
consumer forwards ``{"kind": <kind>, ...payload}`` to the browser.  Snapshots are
aggregated per tick (never one message per request); events and drill progress are
rare, one message each.
"""

from __future__ import annotations

from typing import Any, TypedDict

LIVE_GROUP = "console.live"
EVENTS_GROUP = "console.events"
DRILLS_GROUP = "ops.drills"
ALL_GROUPS = (LIVE_GROUP, EVENTS_GROUP, DRILLS_GROUP)

# Channel-layer ``type`` values map to consumer methods (dots become underscores).
SNAPSHOT_TYPE = "live.snapshot"
EVENT_TYPE = "event.created"
DRILL_TYPE = "drill.progress"


class EventPayload(TypedDict):
    id: int
    created_at: str
    kind: str
    severity: str
    subject: str
    message: str


class DrillPayload(TypedDict):
    run: str  # a console-side id of the drill run (the DrillRun pk once known)
    drill: str
    t: float
    text: str
    done: bool
    outcome: str


def message(kind: str, payload: Any) -> dict[str, Any]:
    return {"type": kind, "payload": payload}
