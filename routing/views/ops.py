"""Read-only endpoints: ``/v1/models``, ``/health``, ``/metrics``.

``/v1/models`` needs an API key like every ``/v1`` endpoint of OpenAI's API.
``/health`` and ``/metrics`` are for operators, Prometheus and the control
plane, which reach balancers on the internal network, so they are not
authenticated (as vLLM's and SGLang's own ``/metrics`` and ``/health``).
``/internal/*`` lives in ``routing.views.internal``.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from routing.core.errors import ApiError, method_not_allowed
from routing.errors import error_response
from routing.process import get_runtime
from routing.views.completions import authorize

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def models(request: HttpRequest) -> HttpResponseBase:
    """The models this balancer can serve: configured ones with a ready replica somewhere."""
    try:
        if request.method != "GET":
            raise method_not_allowed(request.method or "?", "GET")
        runtime = await get_runtime()
        authorize(request, runtime)
    except ApiError as error:
        return error_response(error)
    snapshot = runtime.snapshot
    created = int(snapshot.loaded_at) if snapshot else 0
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "meridian"}
        for name in sorted(snapshot.served_models if snapshot else ())
    ]
    return JsonResponse({"object": "list", "data": data})


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
            "queue": runtime.queues.total(),
            "dead_loops": runtime.dead_loops,
        },
        status=200 if ok else 503,
    )


async def metrics(request: HttpRequest) -> HttpResponseBase:
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
