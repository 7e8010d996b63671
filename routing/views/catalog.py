"""The API's catalogue: ``GET /v1/models``, ``GET /v1/models/{id}``, and the JSON
answer for any other ``/v1`` path.

The model cards come from the balancer's own topology snapshot (the configured
models with a ready replica somewhere), not from a replica, so they answer
while every replica is busy and list what this balancer can route, including
models only a peer region serves.  Both need an API key, as every ``/v1``
endpoint of OpenAI's API does; a key with an allow-list of models sees only those.

A ``/v1`` path that no route serves gets OpenAI's own answer, a JSON 404
(``Invalid URL (POST /v1/...)``) rather than Django's HTML page, so SDKs raise
``NotFoundError`` with a message; it is counted in
``meridian_unknown_path_requests_total``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core import errors
from core.errors import ApiError
from core.key_limits import NO_LIMITS, KeyLimits, model_not_allowed
from fleet.models import hash_api_key
from routing.errors import error_response
from routing.process import current_runtime, get_runtime
from routing.views.completions import api_request, authorize, count_refusal

if TYPE_CHECKING:
    from routing.runtime import BalancerRuntime

# Method label values: a client-chosen method string must not become one (cardinality).
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


async def models(request: HttpRequest) -> HttpResponseBase:
    """The models this balancer can serve: configured ones with a ready replica somewhere."""
    try:
        runtime, limits = await _authorized_get(request)
    except ApiError as error:
        count_refusal(api_request(request), error)
        return error_response(error)
    snapshot = runtime.snapshot
    served = snapshot.served_models if snapshot else ()
    names = sorted(name for name in served if limits.allows(name, name))
    return JsonResponse({"object": "list", "data": [_card(runtime, name) for name in names]})


async def model(request: HttpRequest, model_id: str) -> HttpResponseBase:
    """One model's card, or 404 ``model_not_found`` for a model no replica serves."""
    try:
        runtime, limits = await _authorized_get(request)
        snapshot = runtime.snapshot
        if snapshot is None or model_id not in snapshot.served_models:
            raise errors.model_not_found(model_id)
        if not limits.allows(model_id, model_id):
            raise model_not_allowed(model_id)  # the same 404: nothing learnt
    except ApiError as error:
        count_refusal(api_request(request), error)
        return error_response(error)
    return JsonResponse(_card(runtime, model_id))


@csrf_exempt
async def unknown_path(request: HttpRequest) -> HttpResponseBase:
    """A ``/v1`` path no route serves: OpenAI's JSON 404, whatever the method."""
    method = request.method or "?"
    error = errors.unknown_url(method, request.path)
    runtime = current_runtime()
    if runtime is not None:
        runtime.metrics.unknown_paths.inc(method if method in _METHODS else "other")
    count_refusal(api_request(request), error)
    return error_response(error)


async def _authorized_get(request: HttpRequest) -> tuple[BalancerRuntime, KeyLimits]:
    """The runtime and the key's limits (a key with an allow-list sees only its models)."""
    if request.method != "GET":
        raise errors.method_not_allowed(request.method or "?", "GET")
    runtime = await get_runtime()
    header = authorize(api_request(request), runtime)
    snapshot = runtime.snapshot
    key_hash = hash_api_key(header.partition(" ")[2].strip())
    return runtime, snapshot.key_limits.get(key_hash, NO_LIMITS) if snapshot else NO_LIMITS


def _card(runtime: BalancerRuntime, name: str) -> dict[str, Any]:
    snapshot = runtime.snapshot
    created = int(snapshot.loaded_at) if snapshot else 0
    return {"id": name, "object": "model", "created": created, "owned_by": "meridian"}
