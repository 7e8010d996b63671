"""Pick what a drill acts on, refusing clearly when the choice is empty or ambiguous."""

from __future__ import annotations

from fleet.models import Balancer, Region, Replica


class DrillError(ValueError):
    """A drill that cannot run as asked (nothing to act on, unsafe target)."""


def replicas_for(
    *,
    replica: str | None = None,
    zone: str | None = None,
    region: str | None = None,
    count: int = 1,
) -> list[Replica]:
    """Ready replicas by name, zone or region; spot ones first (a drill plays a spot
    preemption), then by name, at most ``count`` of them for a zone or region."""
    chosen = [x for x in (replica, zone, region) if x]
    if len(chosen) != 1:
        raise DrillError("name exactly one of --replica, --zone, --region")
    if count < 1:
        raise DrillError("--count must be at least 1")
    ready = Replica.objects.filter(state=Replica.State.READY).select_related("region", "zone")
    if replica:
        found = list(ready.filter(name=replica))
        if not found:
            raise DrillError(f"no ready replica named {replica!r}")
        return found
    scoped = ready.filter(zone__name=zone) if zone else ready.filter(region__name=region)
    found = sorted(scoped, key=lambda r: (r.kind != Replica.Kind.SPOT, r.name))[:count]
    if not found:
        raise DrillError(f"no ready replica in {'zone' if zone else 'region'} {zone or region!r}")
    return found


def replica_named(name: str) -> Replica:
    found = Replica.objects.select_related("region", "zone").filter(name=name).first()
    if found is None:
        raise DrillError(f"no replica named {name!r}")
    return found


def live_balancer_of(region: str) -> Balancer:
    """The region's balancer a kill drill targets: its first live one by name."""
    if not Region.objects.filter(name=region).exists():
        raise DrillError(f"no region {region!r}")
    live = Balancer.objects.filter(region__name=region, state=Balancer.State.UP).order_by("name")
    balancer = live.select_related("region").first()
    if balancer is None:
        raise DrillError(f"{region} has no live balancer to kill")
    return balancer
