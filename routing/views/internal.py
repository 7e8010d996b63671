"""Balancer-to-balancer and operator endpoints: ``/internal/availability`` and
``/internal/state``.

``GET /internal/availability`` is what peers poll for cross-region routing
(SkyLB §3.3, Algorithm 1 lines 9-15): this balancer's ``Heartbeat`` as JSON,
per-model available replicas (``models``) and queue lengths (``queues``).  It
is protected by ``Authorization: Bearer <MERIDIAN_INTERNAL_TOKEN>`` because it
is the one input another machine feeds into our routing decisions; the token
is compared in constant time.

``GET /internal/state`` is the full view for the console and the control plane
(replicas, peers as the remote layer sees them, queues, Redis), unauthenticated
on the internal network like ``/metrics``.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from routing.core import errors
from routing.core.errors import ApiError
from routing.errors import error_response
from routing.runtime import BalancerRuntime, get_runtime
from routing.telemetry import QUEUE_CANCELLED, QUEUE_PLACED, QUEUE_TIMEOUT, QueueSnapshot


async def availability(request: HttpRequest) -> HttpResponseBase:
    try:
        if request.method != "GET":
            raise errors.method_not_allowed(request.method or "?", "GET")
        runtime = await get_runtime()
        _check_token(request, runtime.config.internal_token)
    except ApiError as error:
        return error_response(error)
    snapshot = runtime.snapshot
    assert snapshot is not None  # get_runtime returns only after the first topology load
    return HttpResponse(runtime.heartbeat(snapshot).to_json(), content_type="application/json")


def _check_token(request: HttpRequest, token: str) -> None:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer" or not given.strip():
        raise errors.invalid_api_key(provided=False)
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise errors.invalid_api_key(provided=True)


async def internal_state(request: HttpRequest) -> HttpResponseBase:
    try:
        runtime = await get_runtime()
    except ApiError as error:
        return error_response(error)
    return JsonResponse(balancer_state(runtime))


def balancer_state(rt: BalancerRuntime) -> dict[str, Any]:
    """This balancer's view (console, control plane, drills, tests)."""
    snapshot = rt.snapshot
    return {
        "balancer": rt.config.balancer,
        "region": snapshot.region if snapshot else None,
        "url": snapshot.url if snapshot else None,
        "ts": time.time(),
        "topology_loaded_at": snapshot.loaded_at if snapshot else None,
        "topology_error": rt.topology_error,
        "inflight": rt.inflight(),
        "forwarded_inflight": rt.remote.ledger.total,
        "queue": rt.queues.total(),
        "queues": [_queue_row(rt, q) for q in rt.queue_snapshots()],
        "max_outstanding_per_replica": rt.router.max_outstanding,
        "models": [_model_row(rt, m) for m in sorted(snapshot.served_models if snapshot else ())],
        "replicas": [_replica_row(rt, t.target_id) for t in rt.router.targets()],
        "peers": rt.remote.view(),
        "redis": {
            "connected": rt.peers.connected,
            "last_error": rt.peers.last_error,
            "heartbeats": sorted(rt.peers.heartbeats),
        },
        "dead_loops": dict(rt.dead_loops),
    }


def _queue_row(rt: BalancerRuntime, queue: QueueSnapshot) -> dict[str, Any]:
    """Length and oldest wait now, and how many left the queue each way so far."""
    waits = rt.metrics.queue_wait
    return {
        "model": queue.model,
        "length": queue.length,
        "oldest_wait_s": round(queue.oldest_wait_s, 3),
        "placed": waits.count(queue.model, QUEUE_PLACED),
        "timed_out": waits.count(queue.model, QUEUE_TIMEOUT),
        "cancelled": waits.count(queue.model, QUEUE_CANCELLED),
        "rejected_full": int(rt.metrics.queue_rejected.value(queue.model)),
    }


def _model_row(rt: BalancerRuntime, model: str) -> dict[str, Any]:
    spec = rt.router.model_spec(model)
    return {
        "model": model,
        "policy": rt.router.policy_name(model),
        "remote_policy": rt.remote.policy_name(model),
        "pushing": rt.router.pushing(model).mode.value,
        "queue_max_len": spec.queue_max_len if spec else None,
        "queue_max_wait_s": spec.queue_max_wait_s if spec else None,
    }


def _replica_row(rt: BalancerRuntime, name: str) -> dict[str, Any]:
    target = rt.router.target(name)
    assert target is not None  # rows are built from router.targets()
    usage = rt.router.usage(name)
    mark = rt.router.mark(name)
    return {
        "name": name,
        "url": target.url,
        "model": target.model,
        "region": target.region,
        "zone": target.zone,
        "kind": target.kind,
        "healthy": target.healthy,
        "available": rt.router.is_available(target),
        "outstanding": target.outstanding,
        "running": target.running,
        "waiting": target.waiting,
        "unconfirmed_pushes": mark.unconfirmed if mark else 0,
        "kv_usage": target.kv_usage,
        "prefix_hit_rate": target.extra.get("prefix_hit_rate"),
        "consecutive_failures": target.consecutive_failures,
        "requests": usage.requests,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_token_ratio": usage.cached_ratio,
    }
