"""Placement policies by name, as ``ServiceConfig.scaling_policy`` stores them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workers.scaling.base import PlacementPolicy
from workers.scaling.even_spread import EvenSpreadPolicy
from workers.scaling.fleet import ZoneOffer
from workers.scaling.on_demand import OnDemandPolicy
from workers.scaling.round_robin import RoundRobinPolicy
from workers.scaling.spothedge import SpotHedgePolicy
from workers.scaling.static_mix import StaticMixPolicy

POLICIES: dict[str, type[PlacementPolicy]] = {
    cls.name: cls
    for cls in (
        SpotHedgePolicy,
        EvenSpreadPolicy,
        RoundRobinPolicy,
        StaticMixPolicy,
        OnDemandPolicy,
    )
}


def build_policy(
    name: str,
    zones: Sequence[ZoneOffer],
    *,
    n_extra: int = 1,
    static_on_demand: int = 1,
    state: Mapping[str, object] | None = None,
) -> PlacementPolicy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown scaling policy {name!r}; choose from {sorted(POLICIES)}"
        ) from None
    return cls(zones, n_extra=n_extra, static_on_demand=static_on_demand, state=state)
