"""WebSocket URLs of the console (``console.asgi`` routes ``websocket`` here)."""

from __future__ import annotations

from django.urls import path

from console.consumers import LiveConsumer
from console.live.publish import connect_event_publishing

websocket_urlpatterns = [path("ws/live", LiveConsumer.as_asgi())]

# The console process records Events too (drills, operator actions): publish them.
connect_event_publishing()
