"""`manage.py drill_kill_balancer --region R`: crash a region's balancer (SIGKILL).

The balancer's process is found by the port it listens on (loopback URLs only),
killed without a graceful shutdown, and the drill waits until a live balancer routes
to the dead one's replicas (SkyLB §4.2 failover).  Traffic follows the region's
serving balancer as ``/internal/topology`` reports it.  Under ``make run`` the
supervisor restarts the balancer and the controller hands the replicas back.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleet.models import Replica
from ops.drills.cli import Prepared, add_traffic_arguments, run_reported
from ops.drills.kinds import kill_balancer_plan
from ops.drills.targets import live_balancer_of


class Command(BaseCommand):
    help = "SIGKILL a region's balancer and time the failover to the nearest live one."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--region", required=True, help="the region whose balancer dies")
        add_traffic_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        run_reported(self, lambda: self.prepare(options), options)

    def prepare(self, options: dict[str, Any]) -> Prepared:
        balancer = live_balancer_of(options["region"])
        replicas = Replica.objects.filter(region=balancer.region, state=Replica.State.READY)
        model = replicas.values_list("model_name", flat=True).first() or ""
        return kill_balancer_plan(balancer), balancer.region.name, model
