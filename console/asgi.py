"""ASGI entry point served by daphne: the OpenAI-compatible proxy and the console over
HTTP, and the console's live views over WebSockets."""

from __future__ import annotations

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs Django set up first)
from django.conf import settings  # noqa: E402

from routing.body_limit import BodyLimitMiddleware  # noqa: E402

# The console ships its own static files (no CDN, works offline) and the demo has no
# front proxy, so daphne serves them itself unless an operator puts one in front.
http_app = (
    ASGIStaticFilesHandler(django_asgi_app) if settings.MERIDIAN_SERVE_STATIC else django_asgi_app
)

application = ProtocolTypeRouter(
    {"http": BodyLimitMiddleware(http_app, settings.MERIDIAN_MAX_BODY_BYTES)}
)
