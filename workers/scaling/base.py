"""The interface every placement policy shares, and zone helpers they reuse."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar

from workers.scaling.fleet import Fleet, MixTarget, ZoneOffer


class PlacementPolicy(ABC):
    """Decides the spot/on-demand mix and where the next spot replica goes.

    Policies are built per reconcile step from their persisted ``snapshot()`` (the
    controller keeps it in ``ServiceConfig.scaling_state``), so they hold no process
    state of their own between beats.
    """

    name: ClassVar[str]

    def __init__(
        self,
        zones: Sequence[ZoneOffer],
        *,
        n_extra: int = 0,
        static_on_demand: int = 0,
        state: Mapping[str, object] | None = None,
    ) -> None:
        if not zones:
            raise ValueError(f"{self.name}: no zones to place replicas in")
        self.zones = list(zones)
        self.n_extra = n_extra
        self.static_on_demand = static_on_demand
        self.slots = 0
        self.restore(state or {})

    @abstractmethod
    def mix(self, n_target: int, fleet: Fleet) -> MixTarget:
        """Spot and on-demand replicas to keep launched for ``n_target`` ready."""

    def next_spot_zone(self, fleet: Fleet, exclude: frozenset[str]) -> str | None:
        """Zone for the next spot launch (None: none left to try in this step)."""
        return None

    def on_demand_zone(self, fleet: Fleet) -> str:
        # On-demand is "typically available" (SkyServe §3.2): cheapest zone, fewest
        # on-demand replicas already there first, so fallback is spread too.
        used = fleet.of_kind("on-demand")
        return min(
            self.zones,
            key=lambda z: (z.on_demand_price, sum(1 for r in used if r.zone == z.name)),
        ).name

    def spot_preempted(self, zone: str) -> None:
        """A spot replica in ``zone`` was preempted."""

    def spot_launch_failed(self, zone: str) -> None:
        """A spot launch in ``zone`` found no capacity; most policies treat it as a preemption."""
        self.spot_preempted(zone)

    def spot_ready(self, zone: str) -> None:
        """A spot replica in ``zone`` became ready."""

    def snapshot(self) -> dict[str, object]:
        """State to persist between reconcile steps."""
        return {}

    def restore(self, state: Mapping[str, object]) -> None:
        """Load what ``snapshot`` returned (unknown zones are dropped)."""


def even_zone(
    zones: Sequence[ZoneOffer], fleet: Fleet, n_spot: int, exclude: frozenset[str]
) -> str | None:
    """The first zone below its static share of ``n_spot`` (slot i lives in zone i mod N).

    Static spread (AWS ASG, MArk; SkyServe §3.1) never moves a slot: if its zone has no
    capacity, the slot stays empty until the zone comes back.
    """
    counts = fleet.spot_per_zone()
    n = len(zones)
    for i, zone in enumerate(zones):
        share = n_spot // n + (1 if i < n_spot % n else 0)
        if counts[zone.name] < share and zone.name not in exclude:
            return zone.name
    return None
