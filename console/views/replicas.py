"""Replicas page: a sortable, filterable table with live numbers, and the actions an
operator takes on one replica (drain, undrain, remove) or on the fleet (add by URL)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from console.drills.replicas import drain_replica, undrain_replica
from console.drills.targets import DrillError
from console.forms import AddReplicaForm
from console.models import Event, Replica


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
    rows = Replica.objects.select_related("region", "zone", "balancer").order_by(
        "region__name", "name"
    )
    return render(request, "console/replicas.html", {"replicas": rows, "form": form})


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
            raise DrillError(f"unknown action {action!r}")
    except DrillError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{name}: {action} done")
    return redirect("console-replicas")


def remove_replica(name: str, *, actor: str) -> None:
    """Terminate: balancers drop it at their next topology refresh; the row stays as
    history (its spend, its rollups)."""
    with transaction.atomic():
        replica = Replica.objects.select_for_update().filter(name=name).first()
        if replica is None:
            raise DrillError(f"no replica named {name!r}")
        if replica.state == Replica.State.TERMINATED:
            raise DrillError(f"{name} is already terminated")
        old = replica.state
        replica.state, replica.state_changed_at = Replica.State.TERMINATED, timezone.now()
        replica.save(update_fields=["state", "state_changed_at"])
        Event.record(
            "replica_removed",
            f"{name} removed by the operator",
            subject=name,
            previous=old,
            actor=actor,
        )
