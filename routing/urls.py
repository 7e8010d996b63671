"""The balancer's routes: the OpenAI-compatible API and the operator endpoints.

Included at the site root by ``meridian.urls``; paths have no trailing slash, as
the OpenAI API's do, so SDK calls never hit a redirect.  Every inference route
(``Endpoint``) is one view with the endpoint as its argument; any other ``/v1``
path ends at ``catalog.unknown_path``, a JSON 404, so it must stay last.
"""

from __future__ import annotations

from django.urls import URLPattern, path, re_path

from core.openai_request import Endpoint
from routing.views import catalog, completions, internal, ops

urlpatterns: list[URLPattern] = [
    *(
        path(
            endpoint.path.removeprefix("/"),
            completions.proxy,
            {"endpoint": endpoint},
            name=f"v1-{endpoint.name.lower()}",
        )
        for endpoint in Endpoint
    ),
    path("v1/models", catalog.models, name="v1-models"),
    # Model ids may hold slashes ("meta-llama/Llama-3.1-8B"), as the SDKs send them.
    path("v1/models/<path:model_id>", catalog.model, name="v1-model"),
    path("health", ops.health, name="balancer-health"),
    path("metrics", ops.metrics, name="balancer-metrics"),
    path("internal/state", internal.internal_state, name="balancer-internal-state"),
    path("internal/availability", internal.availability, name="balancer-internal-availability"),
    path("internal/cache_sync", internal.cache_sync, name="balancer-internal-cache-sync"),
    path("internal/faults", internal.faults, name="balancer-internal-faults"),
    re_path(r"^v1/", catalog.unknown_path, name="v1-unknown-path"),
]
