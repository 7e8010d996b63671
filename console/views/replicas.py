"""Replicas page: a sortable, filterable table with live numbers, and the actions an
operator takes on one replica (drain, undrain, remove) or on the fleet (add by URL)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.forms import AddReplicaForm
from fleet.models import Event, Region, Replica
from workers.replica_states import (
    ReplicaStateError,
    drain_replica,
    remove_replica,
    undrain_replica,
)


@staff_member_required
def replicas(request: HttpRequest) -> HttpResponse:
    form = AddReplicaForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        replica = form.save()
        Event.record(
            "replica_added",
            f"{replica.name} added at {replica.url}; probe passed, starting",
            subject=replica.name,
            actor=request.user.get_username(),
        )
        messages.success(request, f"{replica.name} added; it takes traffic once probed ready.")
        return redirect("console-replicas")
    rows = list(
        Replica.objects.select_related("region", "zone", "balancer").order_by(
            "region__name", "name"
        )
    )
    warnings = _warnings()
    for row in rows:
        row.warnings = warnings.get(row.name, [])  # type: ignore[attr-defined]
    return render(request, "console/replicas.html", {"replicas": rows, "form": form})


def _warnings() -> dict[str, list[dict[str, str]]]:
    """The balancers' latest warnings, from their live records; the page still renders
    without Redis (the live snapshot fills them in once it arrives).  Imported here, not
    at the top: the URLconf imports this module, and ``manage.py check`` must not pay
    for redis."""
    import redis

    from console.live.feed import latest_warnings

    regions = list(Region.objects.values_list("name", flat=True))
    try:
        with redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.5) as client:
            return latest_warnings(client, regions)
    except (redis.RedisError, ValueError):
        return {}


@staff_member_required
@require_POST
def replica_action(request: HttpRequest, name: str, action: str) -> HttpResponse:
    try:
        if action == "drain":
            drain_replica(name)
        elif action == "undrain":
            undrain_replica(name)
        elif action == "remove":
            remove_replica(name, actor=request.user.get_username())
        else:
            raise ReplicaStateError(f"unknown action {action!r}")
    except ReplicaStateError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{name}: {action} done")
    return redirect("console-replicas")
