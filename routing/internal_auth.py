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

``/metrics`` stays open for scrapers unless ``MERIDIAN_METRICS_TOKEN`` is set; then
it, like ``/metrics/cost`` always, wants a bearer token: that one or the internal
token (``may_scrape``).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

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


def bearer_token(request: HttpRequest) -> str:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def may_scrape(request: HttpRequest, *, open_without_token: bool) -> bool:
    """Whether ``request`` may read metrics: with the metrics token or the internal
    token, or with none when no metrics token is set and ``open_without_token``."""
    metrics_token = settings.MERIDIAN_METRICS_TOKEN
    if open_without_token and not metrics_token:
        return True
    given = bearer_token(request)
    return same_token(given, metrics_token) or same_token(given, settings.MERIDIAN_INTERNAL_TOKEN)


def forwarded_by_peer(request: HttpRequest, token: str) -> bool:
    """Whether ``request`` is a forward from an authenticated peer balancer."""
    return forwarded_with(request.headers, token)


def forwarded_with(headers: Mapping[str, str], token: str) -> bool:
    """``forwarded_by_peer`` from a request's headers (a mapping looked up in any case)."""
    if not headers.get(HOP_HEADER):
        return False
    return same_token(headers.get(PEER_TOKEN_HEADER, ""), token)
