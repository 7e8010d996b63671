"""What a placement policy sees and what it asks for: the fleet, the mix, the launcher.

Plain data shared by the live controller (``workers.scaling.controller``) and the
virtual-time simulator (``workers.scaling.simulate``), so both run the very same
policy objects against different clouds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol

SPOT = "spot"
ON_DEMAND = "on-demand"


@dataclass(frozen=True)
class ZoneOffer:
    """A zone the service may launch in, with its hourly prices (SpotHedge §3.1's Z)."""

    name: str
    region: str
    spot_price: float
    on_demand_price: float


@dataclass(frozen=True)
class FleetReplica:
    """One launched replica: provisioning, starting or ready (never a dead one)."""

    handle: str
    kind: str
    zone: str
    ready: bool
    launched_at: float


@dataclass(frozen=True)
class Fleet:
    replicas: tuple[FleetReplica, ...]

    def of_kind(self, kind: str) -> list[FleetReplica]:
        return [r for r in self.replicas if r.kind == kind]

    def ready(self, kind: str | None = None) -> int:
        return sum(1 for r in self.replicas if r.ready and (kind is None or r.kind == kind))

    def spot_per_zone(self) -> Counter[str]:
        return Counter(r.zone for r in self.replicas if r.kind == SPOT)


@dataclass(frozen=True)
class MixTarget:
    """How many replicas of each kind should be launched (ready or not) right now."""

    spot: int
    on_demand: int


class Launcher(Protocol):
    """The cloud side of a reconcile step: the provider, or the simulator's cloud."""

    def launch(self, kind: str, zone: str) -> str | None:
        """Launch one replica; its handle, or None when the zone has no capacity now."""

    def terminate(self, handle: str) -> None:
        """Terminate one replica (billing stops now)."""
