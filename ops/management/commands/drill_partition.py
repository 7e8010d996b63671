"""`manage.py drill_partition --between A B [--duration S]`.

Cuts forwarding between regions A and B for ``S`` seconds (each side's balancers
treat the other side's as unreachable, through ``POST /internal/faults``), then
reconnects them; the drill reports when both sides saw the cut, whether requests
failed, and when both sides saw each other again (``ops.drills.partition``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ops.drills.cli import Prepared, add_traffic_arguments, run_reported
from ops.drills.partition import partition_plan
from ops.drills.served import model_served_in
from ops.drills.targets import DrillError


class Command(BaseCommand):
    help = "Cut forwarding between two regions for a while and watch both sides converge."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--between", nargs=2, required=True, metavar=("A", "B"))
        parser.add_argument("--duration", type=float, default=10.0, help="seconds cut off")
        add_traffic_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        run_reported(self, lambda: self.prepare(options), options)

    def prepare(self, options: dict[str, Any]) -> Prepared:
        if options["duration"] <= 0:
            raise DrillError("--duration must be positive")
        region_a, region_b = options["between"]
        plan = partition_plan(region_a, region_b, duration_s=options["duration"])
        model = options["model"] or model_served_in(region_a)
        return plan, region_a, model
