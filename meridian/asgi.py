"""ASGI entry point: the OpenAI-compatible proxy and the console over HTTP, the
console's live views over WebSockets, and ASGI lifespan (uvicorn) for balancers.

The inference routes (``POST /v1/chat/completions`` and the other ``Endpoint`` paths)
are served on plain ASGI by ``routing.api_plain.PlainApi``, no Django objects on the
hot path; the rest of ``/v1/`` goes to ``routing.api_asgi.ApiASGIHandler``, Django
without the console's middleware and thread hops (see that module); everything else
keeps the full Django stack.  Balancer processes start their runtime (topology, probes,
peer polls, heartbeats) as soon as the server runs, not on the first request: through
the lifespan protocol under uvicorn, through the reactor under daphne, which sends
no lifespan events.
"""

from __future__ import annotations

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meridian.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import (  # noqa: E402
    AllowedHostsOriginValidator,
    WebsocketDenier,
)
from django.conf import settings  # noqa: E402

from console.routing import websocket_urlpatterns  # noqa: E402
from routing.api_asgi import API_PREFIX, ApiASGIHandler, by_path_prefix  # noqa: E402
from routing.api_plain import PlainApi  # noqa: E402
from routing.body_limit import BodyLimitMiddleware  # noqa: E402
from routing.lifespan import LifespanApp, start_when_daphne_runs  # noqa: E402

# The console ships its own static files (no CDN, works offline) and the demo has no
# front proxy, so daphne serves them itself unless an operator puts one in front.
http_app = (
    ASGIStaticFilesHandler(django_asgi_app) if settings.MERIDIAN_SERVE_STATIC else django_asgi_app
)

application = ProtocolTypeRouter(
    {
        "http": BodyLimitMiddleware(
            by_path_prefix(
                API_PREFIX,
                PlainApi(ApiASGIHandler(), settings.MERIDIAN_MAX_BODY_BYTES),
                http_app,
            ),
            settings.MERIDIAN_MAX_BODY_BYTES,
        ),
        "lifespan": LifespanApp(),
        # The console's live views: session auth, and only pages of an allowed host.
        # A balancer's port serves no console (meridian.urls_balancer): sockets denied.
        "websocket": WebsocketDenier()
        if settings.MERIDIAN_BALANCER
        else AllowedHostsOriginValidator(
            # Its stubs want path()s typed as channels' (see console.routing).
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))  # type: ignore[arg-type]
        ),
    }
)
start_when_daphne_runs()
