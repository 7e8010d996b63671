"""Operator-registered reserved or on-prem replicas (the ``Replica`` rows an operator
enters): Meridian routes to them and bills them at their price, but never launches or
terminates them, so a scaling policy over a static provider can only report."""

from __future__ import annotations

import builtins

from workers.providers.base import CloudProvider, Instance, LaunchSpec, Notice, ProviderRefused
from workers.scaling.fleet import ZoneOffer


class StaticProvider(CloudProvider):
    name = "static"
    can_launch = False

    def __init__(self, zones: list[ZoneOffer]) -> None:
        self._zones = zones

    def zones(self) -> list[ZoneOffer]:
        return list(self._zones)

    def launch(self, spec: LaunchSpec, zone: str, kind: str, now: float) -> Instance | None:
        raise ProviderRefused("static replicas are registered by an operator, not launched")

    def terminate(self, handle: str, now: float) -> None:
        raise ProviderRefused("static replicas are removed by an operator, not terminated")

    def list(self) -> list[Instance]:
        return []

    def poll(self, now: float) -> builtins.list[Notice]:
        return []
