"""Replica state changes that operators and drills make, each recorded as an Event."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from fleet.models import Event, Replica


class ReplicaStateError(ValueError):
    """The replica does not exist, or is not in a state that allows the change."""


def _set_state(replica: Replica, state: str) -> str:
    old = replica.state
    replica.state, replica.state_changed_at = state, timezone.now()
    replica.save(update_fields=["state", "state_changed_at"])
    return old


def mark_preempted(replicas: list[Replica], *, reason: str) -> None:
    """Record a (drilled) spot preemption: the replica leaves routing at the balancers'
    next topology refresh, and the readiness probe no longer revives it."""
    with transaction.atomic():
        for replica in replicas:
            old = _set_state(replica, Replica.State.PREEMPTED)
            Event.record(
                "replica_preempted",
                f"{replica.name} preempted ({reason})",
                subject=replica.name,
                severity=Event.Severity.WARNING,
                previous=old,
                zone=replica.zone.name,
                replica_kind=replica.kind,
                reason=reason,
            )


def drain_replica(name: str) -> str:
    """ready → draining: no new requests; in-flight ones finish.  Returns the old state."""
    with transaction.atomic():
        replica = Replica.objects.select_for_update().filter(name=name).first()
        if replica is None:
            raise ReplicaStateError(f"no replica named {name!r}")
        if replica.state != Replica.State.READY:
            raise ReplicaStateError(
                f"{name} is {replica.state}; only a ready replica can be drained"
            )
        old = _set_state(replica, Replica.State.DRAINING)
        Event.record("replica_draining", f"{name} drained by the operator", subject=name)
    return old


def undrain_replica(name: str) -> str:
    """draining → ready: routable again at the balancers' next topology refresh (the
    readiness probe takes it out again if it does not answer)."""
    with transaction.atomic():
        replica = Replica.objects.select_for_update().filter(name=name).first()
        if replica is None:
            raise ReplicaStateError(f"no replica named {name!r}")
        if replica.state != Replica.State.DRAINING:
            raise ReplicaStateError(f"{name} is {replica.state}, not draining")
        old = _set_state(replica, Replica.State.READY)
        Event.record("replica_undrained", f"{name} back in service", subject=name)
    return old


def remove_replica(name: str, *, actor: str) -> None:
    """Terminate: balancers drop it at their next topology refresh; the row stays as
    history (its spend, its rollups)."""
    with transaction.atomic():
        replica = Replica.objects.select_for_update().filter(name=name).first()
        if replica is None:
            raise ReplicaStateError(f"no replica named {name!r}")
        if replica.state == Replica.State.TERMINATED:
            raise ReplicaStateError(f"{name} is already terminated")
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
