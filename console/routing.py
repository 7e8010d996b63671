"""WebSocket URLs of the console (``meridian.asgi`` routes ``websocket`` here)."""

from __future__ import annotations

from django.urls import path

from console.consumers import LiveConsumer

websocket_urlpatterns = [path("ws/live", LiveConsumer.as_asgi())]
