"""Balancer-to-balancer and operator endpoints: ``/internal/availability``,
``/internal/state``, ``/internal/cache_sync`` and ``/internal/faults``.

``GET /internal/availability`` is what peers poll for cross-region routing
(SkyLB §3.3, Algorithm 1 lines 9-15): this balancer's ``Heartbeat`` as JSON,
per-model available replicas (``models``) and queue lengths (``queues``).  It
is protected by ``Authorization: Bearer <MERIDIAN_INTERNAL_TOKEN>`` because it
is the one input another machine feeds into our routing decisions; the token
is compared in constant time.

``GET /internal/state`` (token) is the full view for the console, the control
plane and the drills (replicas, peers as the remote layer sees them, queues,
Redis).  Each replica row carries its KV-event stream state (``kv_stream``), the
hit-rate mismatch check (``cache_view``) and the ``warnings`` the console shows.

``POST /internal/cache_sync`` (token) runs the anti-entropy sync now (002 §4.4;
the Celery beat task ``sync_cache_state`` calls it): every owned replica of a
``cache_map`` service replaces what the cache map believes of it.  It answers
``{"replicas": {name: {"blocks": n, "error": null}}}``.

``POST /internal/faults`` (token) sets drill faults on this balancer:
``{"partition": ["peer-balancer", ...], "until": epoch_s}`` makes polls of and
forwards to those peers fail as unreachable until ``until`` (an empty list clears
it; ``drill_partition``), ``{"drop_kv_events": n}`` throws away the next n
KV-event messages without a sequence gap (a loss only anti-entropy heals; tests), and
``{"lose_kv_events": n}`` loses the next n before they are seen, as a PUB socket past
its high-water mark does, so the message after them reveals a gap (tests of healing);
``{"kv_fault_replica": name}`` makes both take only that replica's messages (null: any).
It answers the faults now in force.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core import errors
from core.cache_view_check import replica_warnings
from core.engine_metrics import LoraInfo
from core.errors import ApiError
from core.prompts import describe_source
from routing.errors import error_response
from routing.internal_auth import same_token
from routing.process import get_runtime
from routing.telemetry import QUEUE_CANCELLED, QUEUE_PLACED, QUEUE_TIMEOUT, QueueSnapshot

if TYPE_CHECKING:
    from routing.runtime import BalancerRuntime


async def availability(request: HttpRequest) -> HttpResponseBase:
    try:
        runtime = await _authorized(request, "GET")
    except ApiError as error:
        return error_response(error)
    snapshot = runtime.snapshot
    assert snapshot is not None  # get_runtime returns only after the first topology load
    return HttpResponse(runtime.heartbeat(snapshot).to_json(), content_type="application/json")


async def _authorized(request: HttpRequest, method: str) -> BalancerRuntime:
    if request.method != method:
        raise errors.method_not_allowed(request.method or "?", method)
    runtime = await get_runtime()
    _check_token(request, runtime.config.internal_token)
    return runtime


@csrf_exempt  # machine-to-machine, authenticated by the bearer token
async def cache_sync(request: HttpRequest) -> HttpResponseBase:
    try:
        runtime = await _authorized(request, "POST")
    except ApiError as error:
        return error_response(error)
    results = await runtime.kv.sync_all()
    return JsonResponse({"replicas": {name: r.__dict__ for name, r in results.items()}})


@csrf_exempt
async def faults(request: HttpRequest) -> HttpResponseBase:
    try:
        runtime = await _authorized(request, "POST")
        body = _fault_body(request.body)
    except ApiError as error:
        return error_response(error)
    if "partition" in body:
        runtime.partition.set(body["partition"], float(body.get("until") or 0.0))
    if "kv_fault_replica" in body:
        runtime.kv.fault_replica = body["kv_fault_replica"]
    runtime.kv.drop_next += int(body.get("drop_kv_events") or 0)
    runtime.kv.lose_next += int(body.get("lose_kv_events") or 0)
    return JsonResponse(_faults_view(runtime))


def _fault_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        raise errors.invalid_json("not JSON") from None
    if not isinstance(body, dict):
        raise errors.invalid_json("not an object")
    peers = body.get("partition", [])
    if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
        raise errors.invalid_type("partition", "a list of balancer names", peers)
    replica = body.get("kv_fault_replica")
    if replica is not None and not isinstance(replica, str):
        raise errors.invalid_type("kv_fault_replica", "a replica name or null", replica)
    for key in ("until", "drop_kv_events", "lose_kv_events"):
        value = body.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise errors.invalid_value(key, f"'{key}' must be a non-negative number.")
    if peers and body.get("until", 0) <= time.time():
        raise errors.invalid_value("until", "'until' must be in the future to partition.")
    return body


def _faults_view(rt: BalancerRuntime) -> dict[str, Any]:
    return {
        **rt.partition.view(),
        "drop_kv_events": rt.kv.drop_next,
        "lose_kv_events": rt.kv.lose_next,
        "kv_fault_replica": rt.kv.fault_replica,
    }


def _check_token(request: HttpRequest, token: str) -> None:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if not token or scheme.lower() != "bearer" or not given.strip():
        raise errors.invalid_api_key(provided=False)
    if not same_token(given.strip(), token):
        raise errors.invalid_api_key(provided=True)


async def internal_state(request: HttpRequest) -> HttpResponseBase:
    try:
        runtime = await _authorized(request, "GET")
    except ApiError as error:
        return error_response(error)
    return JsonResponse(balancer_state(runtime))


def balancer_state(rt: BalancerRuntime) -> dict[str, Any]:
    """This balancer's view (console, control plane, drills, tests)."""
    snapshot = rt.snapshot
    rt.core.forecast.tick(rt.loop.time())  # the look-ahead maps as of now
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
            # This process's exchange with its siblings (docs/scale-out.md); None: off.
            "shared_state": rt.shared.status() if rt.shared else None,
        },
        "dead_loops": dict(rt.dead_loops),
        "faults": _faults_view(rt),
        "kv_events": rt.kv.view(),
        "length_predictor": rt.core.forecast.predictor.name,
        "lookahead_iterations": rt.core.forecast.config.anticipator.horizon,
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
        # Where routing's tokens come from: the model's own files, or "fallback".
        "tokens": describe_source(rt.encoders.for_model(model)),
        "lora_adapters": sorted(a for a, base in rt.adapters.adapters().items() if base == model),
        # Which block size and scheme key this model's blocks, and where the size came from.
        "block_identity": rt.block_schemes.view(model),
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
        "lora": _lora_view(target.lora),
        "prefix_hit_rate": target.extra.get("prefix_hit_rate"),
        "consecutive_failures": target.consecutive_failures,
        # Probes in a row that timed out while it answered requests (busy, not down).
        "late_probes": target.late_probes,
        "requests": usage.requests,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_token_ratio": usage.cached_ratio,
        **_cache_health(rt, name),
        "forecast": _forecast_view(rt, name),
    }


def _forecast_view(rt: BalancerRuntime, name: str) -> dict[str, Any]:
    """The replica's look-ahead map (PreServe §4.3.1) and its predictions' record."""
    found = rt.core.forecast.replica(name)
    if found is None:
        return {"running": 0, "kv_tokens": 0, "peak_kv_tokens": 0, "lookahead": []}
    tally = found.tally
    return {
        "running": found.running,
        "kv_tokens": found.kv_tokens,
        "peak_kv_tokens": found.peak_kv_tokens,
        "mean_kv_tokens": round(found.mean_kv_tokens, 1),
        "lookahead": list(found.lookahead),
        "seconds_per_iteration": round(found.seconds_per_iteration, 5),
        "predicted_requests": tally.completed,
        "mean_absolute_error": round(tally.mean_absolute_error, 1),
        "overran": tally.overran,
    }


def _cache_health(rt: BalancerRuntime, name: str) -> dict[str, Any]:
    """The replica's KV-event stream state and mismatch check, and the warnings a human
    should read (plain language, with what to fix) for the console."""
    stream = rt.kv.health.states.get(name)
    view = rt.cache_view.view(name)
    return {
        "kv_stream": str(stream) if stream is not None else None,
        "cache_view": view,
        "warnings": replica_warnings(stream, view),
    }


def _lora_view(info: LoraInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {
        "running": sorted(info.running),
        "waiting": sorted(info.waiting),
        "max_lora": info.max_lora,
    }
