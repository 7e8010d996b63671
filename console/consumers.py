"""The console's WebSocket: one staff-only consumer per browser page.

It joins the live snapshot, events and drills groups in ``connect`` (after checking
the session's user is active staff; anyone else is closed with 4403 before the
handshake is accepted) and forwards each group message to the browser as
``{"kind": ..., ...payload}`` (an Event under ``"event"``: it has a kind of its
own).  One handler per message type, named after it.
"""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.live.messages import ALL_GROUPS

FORBIDDEN = 4403


class LiveConsumer(AsyncJsonWebsocketConsumer):
    groups: list[str] = []  # joined by hand in connect, only after the staff check

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_active or not user.is_staff:
            await self.close(code=FORBIDDEN)
            return
        for group in ALL_GROUPS:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in ALL_GROUPS:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The socket is one-way; actions are CSRF-checked POSTs, never socket frames.
        if content == {"kind": "ping"}:
            await self.send_json({"kind": "pong"})

    async def live_snapshot(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": "snapshot", **event["payload"]})

    async def event_created(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": "event", "event": event["payload"]})

    async def drill_progress(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": "drill", **event["payload"]})
