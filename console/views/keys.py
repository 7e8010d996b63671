"""API keys page: every key with its limits and its usage (rolled up from Redis by
``workers.key_usage``; the balancers' ``/metrics`` have the live counts)."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.models import ApiKey


@staff_member_required
def keys(request: HttpRequest) -> HttpResponse:
    rows = ApiKey.objects.order_by("revoked", "name")
    return render(request, "console/keys.html", {"keys": rows})
