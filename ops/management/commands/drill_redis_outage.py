"""`manage.py drill_redis_outage --duration S`.

Makes Redis unavailable to every client for ``S`` seconds with ``CLIENT PAUSE``
(bounded and self-healing; loopback Redis only), while traffic goes to a balancer:
the drill reports when the balancers noticed, that requests kept succeeding on
local state, and when heartbeats and balancer states converged again
(``ops.drills.redis_outage``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleet.models import Balancer
from ops.drills.cli import Prepared, add_traffic_arguments, run_reported
from ops.drills.redis_outage import redis_outage_plan
from ops.drills.served import model_served_in
from ops.drills.targets import DrillError


class Command(BaseCommand):
    help = "Pause Redis for every client for a while; routing must go on and converge."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--duration", type=float, default=5.0, help="seconds Redis pauses")
        parser.add_argument("--region", default="", help="region whose clients send traffic")
        add_traffic_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        run_reported(self, lambda: self.prepare(options), options)

    def prepare(self, options: dict[str, Any]) -> Prepared:
        plan = redis_outage_plan(options["duration"])
        region = options["region"] or self._first_region()
        return plan, region, options["model"] or model_served_in(region)

    @staticmethod
    def _first_region() -> str:
        live = Balancer.objects.filter(state=Balancer.State.UP).select_related("region")
        balancer = live.order_by("name").first()
        if balancer is None:
            raise DrillError("no live balancer to send traffic to")
        return str(balancer.region.name)
