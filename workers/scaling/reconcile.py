"""One reconcile step: bring the launched fleet to the policy's mix.

Scale-down picks replicas that are not ready yet before ready ones, newest first
(a not-ready replica serves nothing and a young one has sunk the least cold start),
so Dynamic Fallback's on-demand replicas leave without touching serving capacity
when they can.  Scale-up asks the policy for a zone per spot launch; a zone that
refuses (no capacity) is reported to the policy and not retried in the same step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.scaling.base import PlacementPolicy
from workers.scaling.fleet import ON_DEMAND, SPOT, Fleet, FleetReplica, Launcher, MixTarget


@dataclass
class ReconcileResult:
    target: MixTarget
    launched: list[tuple[str, str, str]] = field(default_factory=list)  # kind, zone, handle
    refused: list[tuple[str, str]] = field(default_factory=list)  # kind, zone
    terminated: list[str] = field(default_factory=list)


def _victims(replicas: list[FleetReplica], count: int) -> list[FleetReplica]:
    ordered = sorted(replicas, key=lambda r: (r.ready, -r.launched_at))
    return ordered[: max(0, count)]


def reconcile(
    policy: PlacementPolicy, n_target: int, fleet: Fleet, launcher: Launcher, *, now: float
) -> ReconcileResult:
    target = policy.mix(n_target, fleet)
    result = ReconcileResult(target=target)
    kept: list[FleetReplica] = []
    for kind, wanted in ((SPOT, target.spot), (ON_DEMAND, target.on_demand)):
        mine = fleet.of_kind(kind)
        gone = {r.handle for r in _victims(mine, len(mine) - wanted)}
        for handle in sorted(gone):
            launcher.terminate(handle)
            result.terminated.append(handle)
        kept += [r for r in mine if r.handle not in gone]
    _launch_spot(policy, target.spot, kept, launcher, result, now)
    _launch_on_demand(policy, target.on_demand, kept, launcher, result, now)
    return result


def _launch_spot(
    policy: PlacementPolicy,
    wanted: int,
    kept: list[FleetReplica],
    launcher: Launcher,
    result: ReconcileResult,
    now: float,
) -> None:
    refused: set[str] = set()
    while sum(1 for r in kept if r.kind == SPOT) < wanted:
        zone = policy.next_spot_zone(Fleet(tuple(kept)), frozenset(refused))
        if zone is None:
            return
        handle = launcher.launch(SPOT, zone)
        if handle is None:
            refused.add(zone)
            policy.spot_launch_failed(zone)
            result.refused.append((SPOT, zone))
            continue
        kept.append(FleetReplica(handle, SPOT, zone, ready=False, launched_at=now))
        result.launched.append((SPOT, zone, handle))


def _launch_on_demand(
    policy: PlacementPolicy,
    wanted: int,
    kept: list[FleetReplica],
    launcher: Launcher,
    result: ReconcileResult,
    now: float,
) -> None:
    while sum(1 for r in kept if r.kind == ON_DEMAND) < wanted:
        zone = policy.on_demand_zone(Fleet(tuple(kept)))
        handle = launcher.launch(ON_DEMAND, zone)
        if handle is None:
            result.refused.append((ON_DEMAND, zone))
            return
        kept.append(FleetReplica(handle, ON_DEMAND, zone, ready=False, launched_at=now))
        result.launched.append((ON_DEMAND, zone, handle))
