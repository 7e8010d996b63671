"""`manage.py drill_preempt`: play a spot preemption on one or more replicas.

Each chosen replica gets ``POST /fault {"mode": "die"}`` and is marked ``preempted``
(with an Event); the drill then waits until no balancer routes to it and reports
what clients saw.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ops.drills.cli import Prepared, add_traffic_arguments, run_reported
from ops.drills.kinds import preempt_plan
from ops.drills.targets import replicas_for


class Command(BaseCommand):
    help = "Preempt replicas as a spot provider would (die + preempted) and time the reroute."

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--replica", help="one replica by name")
        target.add_argument("--zone", help="replicas of a zone (spot first)")
        target.add_argument("--region", help="replicas of a region (spot first)")
        parser.add_argument("--count", type=int, default=1, help="how many, for --zone/--region")
        add_traffic_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        run_reported(self, lambda: self.prepare(options), options)

    def prepare(self, options: dict[str, Any]) -> Prepared:
        replicas = replicas_for(
            replica=options["replica"],
            zone=options["zone"],
            region=options["region"],
            count=options["count"],
        )
        return preempt_plan(replicas), replicas[0].region.name, replicas[0].model_name
