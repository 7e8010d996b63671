"""On-demand only: ``N_tar`` on-demand replicas in the cheapest zones, never spot.

The reference every cost is relative to (SkyServe Figure 14b: "cost is relative to
N_tar on-demand replicas").
"""

from __future__ import annotations

from workers.scaling.base import PlacementPolicy
from workers.scaling.fleet import Fleet, MixTarget


class OnDemandPolicy(PlacementPolicy):
    name = "on_demand"

    def mix(self, n_target: int, fleet: Fleet) -> MixTarget:
        return MixTarget(spot=0, on_demand=n_target)
