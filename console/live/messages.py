"""Group names and message payloads of the console's live transport.

Every message a consumer receives is ``{"type": <handler>, "payload": {...}}``; the
consumer forwards ``{"kind": <kind>, ...payload}`` to the browser.  Events and drill
progress are rare, one message each.  Live numbers do not use the channel layer: each
consumer reads the balancers' live streams itself (``console.live.feed``).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

EVENTS_GROUP = "console.events"
DRILLS_GROUP = "ops.drills"
ALL_GROUPS = (EVENTS_GROUP, DRILLS_GROUP)

# Channel-layer ``type`` values map to consumer methods (dots become underscores).
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
    # Set by ``publish_drill``: this process's running count of drill lines, by which a
    # page drops a line it was sent twice.
    seq: NotRequired[int]


def message(kind: str, payload: Any) -> dict[str, Any]:
    return {"type": kind, "payload": payload}
