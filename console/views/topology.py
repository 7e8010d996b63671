"""``GET /internal/topology``: who serves what, for clients and operators.

Clients of a region whose balancer died need to know where to send requests until
it is back: ``regions[].serving_url`` is a live local balancer, else the one that
took the region's replicas over (SkyLB §4.2), else the nearest live one.  The view
also lists every balancer (heartbeat state, probe health, URL) and every replica's
owner, so an operator sees a failover at a glance.

Authorised like the client API (``Authorization: Bearer <api key>``, checked against
the stored key hashes) or by a staff session in the browser.  It reads the database,
so it is a plain sync view; it is not on the request path of any completion.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from fleet.models import ApiKey, Balancer, Region, Replica, hash_api_key
from workers.ownership import RegionRoute, balancers_serving, region_routes


def _bearer_key(request: HttpRequest) -> str | None:
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    return raw.strip() if scheme.lower() == "bearer" and raw.strip() else None


def is_authorized(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    raw = _bearer_key(request)
    if raw is None:
        return False
    return ApiKey.objects.filter(key_hash=hash_api_key(raw), revoked=False).exists()


def _error(status: int, message: str, code: str) -> JsonResponse:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return JsonResponse({"error": error}, status=status)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def topology(request: HttpRequest) -> JsonResponse:
    if request.method != "GET":
        response = _error(405, f"{request.method} is not allowed here; use GET", "method")
        response["Allow"] = "GET"
        return response
    if not is_authorized(request):
        return _error(401, "Send an API key as 'Authorization: Bearer <key>'.", "invalid_api_key")
    return JsonResponse(topology_document())


def topology_document() -> dict[str, Any]:
    regions = list(Region.objects.all())
    balancers = list(Balancer.objects.select_related("region"))
    replicas = list(
        Replica.objects.select_related("region", "zone", "balancer", "home_balancer").exclude(
            state=Replica.State.TERMINATED
        )
    )
    routes = region_routes(regions, balancers, replicas)
    serving = {r.name: [b.name for b in balancers_serving(r, balancers)] for r in replicas}
    return {
        "generated_at": timezone.now().isoformat(),
        "regions": [_region(region, balancers, routes[region.name]) for region in regions],
        "balancers": [_balancer(b, replicas, serving) for b in balancers],
        "replicas": [_replica(r, serving[r.name]) for r in replicas],
    }


def _region(region: Region, balancers: list[Balancer], route: RegionRoute) -> dict[str, Any]:
    return {
        "name": region.name,
        "display_name": region.display_name,
        "balancers": [b.name for b in balancers if b.region_id == region.id],
        "serving_balancer": route.balancer.name if route.balancer else None,
        "serving_url": route.balancer.url if route.balancer else None,
        "route": route.reason,
    }


def _balancer(
    balancer: Balancer, replicas: list[Replica], serving: dict[str, list[str]]
) -> dict[str, Any]:
    routable = [
        r.name
        for r in replicas
        if balancer.name in serving[r.name] and r.state in Replica.ROUTABLE_STATES
    ]
    return {
        "name": balancer.name,
        "region": balancer.region.name,
        "url": balancer.url,
        "state": balancer.state,
        "last_heartbeat": _iso(balancer.last_heartbeat),
        "health": balancer.health,
        "last_probe_at": _iso(balancer.last_probe_at),
        "routes_to": routable,
    }


def _replica(replica: Replica, served_by: list[str]) -> dict[str, Any]:
    return {
        "name": replica.name,
        "region": replica.region.name,
        "zone": replica.zone.name,
        "kind": replica.kind,
        "state": replica.state,
        "model": replica.model_name,
        "url": replica.url,
        "owner": replica.balancer.name if replica.balancer else None,
        "handover": replica.handover or None,
        "home_balancer": replica.home_balancer.name if replica.home_balancer else None,
        "served_by": served_by,
    }
