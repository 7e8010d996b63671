"""Static mix (AWS Autoscaling Group with an on-demand base, SkyServe §2.4): a fixed
pool of ``static_on_demand`` on-demand replicas plus ``N_tar - static_on_demand`` spot
replicas spread evenly.  Lost spot is not replaced by on-demand, so the pool sizes are
either costly (large base) or leave availability to the spot market (small base).
"""

from __future__ import annotations

from workers.scaling.base import PlacementPolicy, even_zone
from workers.scaling.fleet import Fleet, MixTarget


class StaticMixPolicy(PlacementPolicy):
    name = "static_mix"

    def mix(self, n_target: int, fleet: Fleet) -> MixTarget:
        base = min(self.static_on_demand, n_target)
        self.slots = n_target - base
        return MixTarget(spot=self.slots, on_demand=base)

    def next_spot_zone(self, fleet: Fleet, exclude: frozenset[str]) -> str | None:
        return even_zone(self.zones, fleet, self.slots, exclude)
