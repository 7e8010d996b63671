"""Round Robin (Ray Serve, GKE; SkyServe §3.1 and §5.2 baseline): ``N_tar`` spot
replicas, each launch (first or replacement) going to the next zone in a fixed cycle.

It spreads preemptions over zones (E[K] = nT · N / Σλ_i, lower than static spread)
but keeps no memory of which zones preempt, so it retries a bad zone every lap.
"""

from __future__ import annotations

from collections.abc import Mapping

from workers.scaling.base import PlacementPolicy
from workers.scaling.fleet import Fleet, MixTarget


class RoundRobinPolicy(PlacementPolicy):
    name = "round_robin"

    def restore(self, state: Mapping[str, object]) -> None:
        cursor = state.get("cursor", 0)
        self.cursor = cursor if isinstance(cursor, int) else 0

    def snapshot(self) -> dict[str, object]:
        return {"cursor": self.cursor}

    def mix(self, n_target: int, fleet: Fleet) -> MixTarget:
        return MixTarget(spot=n_target, on_demand=0)

    def next_spot_zone(self, fleet: Fleet, exclude: frozenset[str]) -> str | None:
        for _ in range(len(self.zones)):
            zone = self.zones[self.cursor % len(self.zones)].name
            self.cursor = (self.cursor + 1) % len(self.zones)
            if zone not in exclude:
                return zone
        return None
