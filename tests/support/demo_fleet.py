"""The demo's topology as rows: three regions, nine replicas, a balancer each.  Most
console and operator tests act on this fleet, as a person would after ``make run``."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from fleet.models import Replica
from ops.demo import plan_demo, seed_demo


def seed_demo_fleet(ready: Collection[str] | Literal["all"] = ()) -> None:
    """Seed the demo's rows (at its default ports); ``ready`` names the replicas the
    readiness probe would have promoted by now, or ``"all"``."""
    seed_demo(plan_demo("127.0.0.1", 8100, 9100))
    replicas = Replica.objects.all()
    if ready != "all":
        replicas = replicas.filter(name__in=ready)
    replicas.update(state=Replica.State.READY)
