"""`manage.py drill_slow_replica --replica NAME --factor F [--duration S]`.

Slows one replica's engine ``F`` times (``POST /fault {"mode": "slow"}``) for ``S``
seconds, then restores it; the drill reports when the balancers saw it loaded (and
so stopped preferring it) and whether any request failed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ops.drills.cli import Prepared, add_traffic_arguments, run_reported
from ops.drills.kinds import slow_replica_plan
from ops.drills.targets import DrillError, replicas_for


class Command(BaseCommand):
    help = "Slow a replica down for a while and watch load-aware routing move away from it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--replica", required=True)
        parser.add_argument("--factor", type=float, required=True, help="slowdown, e.g. 4")
        parser.add_argument("--duration", type=float, default=10.0, help="seconds slowed")
        add_traffic_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        run_reported(self, lambda: self.prepare(options), options)

    def prepare(self, options: dict[str, Any]) -> Prepared:
        if options["factor"] <= 1 or options["duration"] <= 0:
            raise DrillError("--factor must be above 1 and --duration positive")
        replica = replicas_for(replica=options["replica"])[0]
        plan = slow_replica_plan(replica, factor=options["factor"], duration_s=options["duration"])
        return plan, replica.region.name, replica.model_name
