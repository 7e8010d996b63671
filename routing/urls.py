"""The balancer's routes: the OpenAI-compatible API and the operator endpoints.

Included at the site root by ``meridian.urls``; paths have no trailing slash, as
the OpenAI API's do, so SDK calls never hit a redirect.
"""

from __future__ import annotations

from django.urls import URLPattern, path

from routing.views import completions, internal, ops

urlpatterns: list[URLPattern] = [
    path("v1/chat/completions", completions.chat_completions, name="v1-chat-completions"),
    path("v1/completions", completions.completions, name="v1-completions"),
    path("v1/models", ops.models, name="v1-models"),
    path("health", ops.health, name="balancer-health"),
    path("metrics", ops.metrics, name="balancer-metrics"),
    path("internal/state", internal.internal_state, name="balancer-internal-state"),
    path("internal/availability", internal.availability, name="balancer-internal-availability"),
    path("internal/cache_sync", internal.cache_sync, name="balancer-internal-cache-sync"),
    path("internal/faults", internal.faults, name="balancer-internal-faults"),
]
