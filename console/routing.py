"""WebSocket URLs of the console (``meridian.asgi`` routes ``websocket`` here)."""

from __future__ import annotations

from django.urls import path

from console.consumers import LiveConsumer

# django-stubs types path() for Django views only; channels routes ASGI apps with it.
websocket_urlpatterns = [path("ws/live", LiveConsumer.as_asgi())]  # type: ignore[arg-type]
