"""SpotHedge (SkyServe §3): Dynamic Placement, over-provisioning and Dynamic Fallback.

Dynamic Placement (Algorithm 1) keeps two zone lists: ``Z_A`` (available, initially
every enabled zone) and ``Z_P`` (preempting, initially empty).  A preemption — or a
launch that finds no capacity, as in Figure 7's zone 2 — moves the zone to ``Z_P``; a
spot replica becoming ready there moves it back.  When fewer than two zones remain in
``Z_A`` every zone is rebalanced back into it, so spot never piles into one zone and
risks one correlated preemption taking them all (§2.2).  The next spot replica goes to
a zone of ``Z_A`` not currently used, else any zone of ``Z_A``; ties by lowest spot
price.

Over-provisioning keeps ``N_tar + N_extra`` spot replicas launched (§3.2: a small
``N_extra`` is the buffer that carries load while a replacement cold-starts).
Dynamic Fallback keeps ``O(t) = min(N_tar, N_tar + N_extra - S_ready(t))`` on-demand
replicas launched, so on-demand is launched the moment ready spot falls short and
terminated once ``N_tar + N_extra`` spot replicas are ready again.
"""

from __future__ import annotations

from collections.abc import Mapping

from workers.scaling.base import PlacementPolicy
from workers.scaling.fleet import SPOT, Fleet, MixTarget


class SpotHedgePolicy(PlacementPolicy):
    name = "spothedge"

    def restore(self, state: Mapping[str, object]) -> None:
        known = [z.name for z in self.zones]
        preempting = state.get("preempting", [])
        self.preempting = [z for z in known if isinstance(preempting, list) and z in preempting]
        self.available = [z for z in known if z not in self.preempting]

    def snapshot(self) -> dict[str, object]:
        return {"available": list(self.available), "preempting": list(self.preempting)}

    def mix(self, n_target: int, fleet: Fleet) -> MixTarget:
        spot = n_target + self.n_extra if n_target > 0 else 0
        fallback = min(n_target, spot - fleet.ready(SPOT))
        return MixTarget(spot=spot, on_demand=max(0, fallback))

    def spot_preempted(self, zone: str) -> None:
        # Algorithm 1, HANDLE-PREEMPTION.
        if zone in self.available:
            self.available.remove(zone)
            self.preempting.append(zone)
        if len(self.available) < 2:
            self.available += self.preempting
            self.preempting = []

    def spot_ready(self, zone: str) -> None:
        # Algorithm 1, HANDLE-LAUNCH.
        if zone in self.preempting:
            self.preempting.remove(zone)
            self.available.append(zone)

    def next_spot_zone(self, fleet: Fleet, exclude: frozenset[str]) -> str | None:
        # Algorithm 1, SELECT-NEXT-ZONE; ``exclude`` holds zones that refused a launch in
        # this very step (a rebalance may have put them back in Z_A).
        price = {z.name: z.spot_price for z in self.zones}
        candidates = [z for z in self.available if z not in exclude]
        in_use = set(fleet.spot_per_zone())
        unused = [z for z in candidates if z not in in_use]
        pool = unused or candidates
        if not pool:
            return None
        return min(pool, key=lambda z: price[z])
