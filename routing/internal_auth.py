"""Who may call a balancer's internal endpoints, and whose hop header counts.

The install's internal token (``MERIDIAN_INTERNAL_TOKEN``) is the one credential
balancers, the control plane, the console and the drills share.  Internal
endpoints (``/internal/*``) take it as ``Authorization: Bearer <token>``.  A
forwarded inference request already carries the client's own API key in
``Authorization`` (the peer checks it again), so the forwarding balancer proves
itself in ``X-Meridian-Peer-Token``: only then does the receiving balancer believe
``X-Meridian-Forwarded-From`` and keep the request local.  A client that sets the
hop header itself is routed as any other client.  Tokens are compared in constant
time.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest

from routing.calls import HOP_HEADER

PEER_TOKEN_HEADER = "X-Meridian-Peer-Token"


def internal_headers(token: str) -> dict[str, str]:
    """The headers that authenticate a caller of ``/internal/*``."""
    return {"Authorization": f"Bearer {token}"}


def install_headers() -> dict[str, str]:
    """``internal_headers`` with this install's token, for its own tools and pages."""
    return internal_headers(settings.MERIDIAN_INTERNAL_TOKEN)


def same_token(given: str, token: str) -> bool:
    return bool(token) and hmac.compare_digest(given.encode(), token.encode())


def forwarded_by_peer(request: HttpRequest, token: str) -> bool:
    """Whether ``request`` is a forward from an authenticated peer balancer."""
    if not request.headers.get(HOP_HEADER):
        return False
    return same_token(request.headers.get(PEER_TOKEN_HEADER, ""), token)
