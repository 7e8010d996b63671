"""Read-only operator endpoints: ``/health``, ``/metrics``.

They are for operators, Prometheus and the control plane, which reach
balancers on the internal network, so by default they are not authenticated (as
vLLM's and SGLang's own ``/metrics`` and ``/health``); with ``MERIDIAN_METRICS_TOKEN``
set, ``/metrics`` wants it (or the internal token) as a bearer token.  ``/internal/*`` lives in
``routing.views.internal``, ``/v1/models`` in ``routing.views.catalog``.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from core import errors
from core.errors import ApiError
from routing.errors import error_response
from routing.internal_auth import bearer_token, may_scrape
from routing.process import get_runtime

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def health(request: HttpRequest) -> HttpResponseBase:
    """200 while this process can do its job; 503 with the reason otherwise."""
    if not settings.MERIDIAN_BALANCER:
        return JsonResponse({"status": "ok", "role": "console", "balancer": None})
    try:
        runtime = await get_runtime()
    except ApiError as error:
        return JsonResponse({"status": "unavailable", "reason": error.message}, status=503)
    healthy, available = runtime.router.counts()
    ok = not runtime.dead_loops
    return JsonResponse(
        {
            "status": "ok" if ok else "degraded",
            "role": "balancer",
            "balancer": runtime.config.balancer,
            "healthy_replicas": healthy,
            "available_replicas": available,
            "topology_error": runtime.topology_error,
            "redis_connected": runtime.peers.connected,
            "shared_state": runtime.shared.status() if runtime.shared else None,
            "queue": runtime.queues.total(),
            "dead_loops": runtime.dead_loops,
        },
        status=200 if ok else 503,
    )


async def metrics(request: HttpRequest) -> HttpResponseBase:
    if not may_scrape(request, open_without_token=True):
        return error_response(errors.invalid_api_key(provided=bool(bearer_token(request))))
    if not settings.MERIDIAN_BALANCER:
        text = (
            "# HELP meridian_balancer_process 1 in a balancer process, 0 in the console.\n"
            "# TYPE meridian_balancer_process gauge\nmeridian_balancer_process 0\n"
        )
        return HttpResponse(text, content_type=PROMETHEUS_CONTENT_TYPE)
    try:
        runtime = await get_runtime()
    except ApiError as error:
        return error_response(error)
    return HttpResponse(runtime.render_metrics(), content_type=PROMETHEUS_CONTENT_TYPE)
