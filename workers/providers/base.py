"""The provider interface: what the scaling loop (``workers.scaling_glue``) may ask of a cloud."""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from dataclasses import dataclass
from decimal import Decimal

from workers.scaling.fleet import ZoneOffer


class ProviderRefused(RuntimeError):
    """The provider does not do this (e.g. a static provider asked to launch)."""


@dataclass(frozen=True)
class LaunchSpec:
    """What to run: the served model and the replica's name."""

    model_name: str
    replica_name: str


@dataclass(frozen=True)
class Instance:
    """A launched instance as the provider sees it.

    ``state``: provisioning (billed, not running yet), running (the replica process
    is up; readiness is the control plane's probe), preempted, terminated.
    """

    handle: str
    kind: str
    zone: str
    url: str
    state: str
    launched_at: float
    ended_at: float | None = None


PREEMPTION_WARNING = "preemption-warning"


@dataclass(frozen=True)
class Notice:
    """A state change the provider observed: ``running``, ``preempted`` or ``terminated``;
    or ``preemption-warning``: the cloud announced that it will reclaim this spot
    instance (at ``preempt_at`` when it said), and the replica is drained at once.

    ``url``: where a replica that is now running answers, for providers that learn it
    only then (a cloud's address); empty when the launch already said.
    """

    handle: str
    event: str
    zone: str
    at: float
    preempt_at: float | None = None
    url: str = ""


class CloudProvider(ABC):
    name: str
    # False for providers whose replicas an operator registers: the scaling loop then
    # only records their notices and never asks for a launch.
    can_launch: bool = True

    @abstractmethod
    def zones(self) -> list[ZoneOffer]:
        """Zones this provider can launch in, with prices."""

    @abstractmethod
    def launch(self, spec: LaunchSpec, zone: str, kind: str, now: float) -> Instance | None:
        """Start launching; None when the zone has no capacity of that kind now."""

    @abstractmethod
    def terminate(self, handle: str, now: float) -> None:
        """Terminate an instance; billing stops now."""

    # Below this method, ``list`` in the class body names it: annotations there say
    # ``builtins.list``.
    @abstractmethod
    def list(self) -> list[Instance]:
        """Every instance this provider launched and still knows about."""

    @abstractmethod
    def poll(self, now: float) -> builtins.list[Notice]:
        """Advance to ``now``: finish cold starts, apply preemptions; what changed.

        A provider that hears of preemptions ahead of time reports each once as a
        ``preemption-warning`` notice before its ``preempted`` one."""

    def close(self) -> None:
        """Release what this process holds (child processes, connections)."""

    def price(self, zone: str, kind: str) -> Decimal:
        for offer in self.zones():
            if offer.name == zone:
                value = offer.spot_price if kind == "spot" else offer.on_demand_price
                return Decimal(str(value))
        raise KeyError(zone)
