"""Even Spread (SkyServe §3.1 "Static Spread", §5.2 baseline): ``N_tar`` spot replicas,
slot *i* pinned to zone *i mod N*, no on-demand.

This is what AWS Autoscaling Groups and MArk do across a region's zones.  A slot whose
zone has no capacity stays empty until the zone returns, so the expected number of
preemptions is dominated by the most-preempting zone (§3.1's E[K] = nT/N · Σλ_i).
"""

from __future__ import annotations

from workers.scaling.base import PlacementPolicy, even_zone
from workers.scaling.fleet import Fleet, MixTarget


class EvenSpreadPolicy(PlacementPolicy):
    name = "even_spread"

    def mix(self, n_target: int, fleet: Fleet) -> MixTarget:
        self.slots = n_target  # static slots: a lost slot is refilled in its own zone
        return MixTarget(spot=n_target, on_demand=0)

    def next_spot_zone(self, fleet: Fleet, exclude: frozenset[str]) -> str | None:
        return even_zone(self.zones, fleet, self.slots, exclude)
