"""A scripted cloud for pure scaling tests: the ``Launcher`` a reconcile step drives.

Spot capacity per zone is set by the test, and replicas become ready or are preempted
when the test says so, so each step of SkyServe's Figure 7 narrative can be staged
exactly.  No database, no settings, no clock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from workers.scaling.base import PlacementPolicy
from workers.scaling.fleet import SPOT, Fleet, FleetReplica, ZoneOffer

ZONES = [
    ZoneOffer(f"zone{i}", "r", spot_price=1.0 + i / 10, on_demand_price=3.0) for i in (1, 2, 3)
]


@dataclass
class ScriptedCloud:
    capacity: dict[str, int] = field(default_factory=lambda: {z.name: 10 for z in ZONES})
    live: dict[str, FleetReplica] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    terminated: list[FleetReplica] = field(default_factory=list)

    def launch(self, kind: str, zone: str) -> str | None:
        if kind == SPOT and self.spot_in(zone) >= self.capacity[zone]:
            return None
        handle = f"{kind}-{zone}-{next(self.ids)}"
        self.live[handle] = FleetReplica(handle, kind, zone, ready=False, launched_at=0.0)
        return handle

    def terminate(self, handle: str) -> None:
        self.terminated.append(self.live.pop(handle))

    def spot_in(self, zone: str) -> int:
        return sum(1 for r in self.live.values() if r.kind == SPOT and r.zone == zone)

    def make_ready(self, policy: PlacementPolicy | None = None) -> None:
        """Every launched replica is ready; ``policy``, when given, hears of the spot ones."""
        for handle, r in list(self.live.items()):
            if not r.ready:
                self.live[handle] = FleetReplica(r.handle, r.kind, r.zone, True, r.launched_at)
                if r.kind == SPOT and policy is not None:
                    policy.spot_ready(r.zone)

    def lose_zone(self, zone: str, policy: PlacementPolicy | None = None) -> list[FleetReplica]:
        """``zone`` has no spot capacity any more; its spot replicas are preempted."""
        self.capacity[zone] = 0
        lost = [r for r in self.live.values() if r.kind == SPOT and r.zone == zone]
        for r in lost:
            del self.live[r.handle]
            if policy is not None:
                policy.spot_preempted(zone)
        return lost

    def fleet(self) -> Fleet:
        return Fleet(tuple(self.live.values()))

    def count(self, kind: str, zone: str | None = None) -> int:
        return sum(1 for r in self.live.values() if r.kind == kind and zone in (None, r.zone))
