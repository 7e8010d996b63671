"""`manage.py failback --region REGION`: hand a region's replicas back home.

Undoes a planned (or automatic) failover: each handed-over replica returns to the
balancer it had before.  Refused while that balancer is down, unless ``--force``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ops.management.commands.failover import describe
from workers.failover import FailoverError, plan_failback


class Command(BaseCommand):
    help = "Return a region's handed-over replicas to their own balancer."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--region", required=True)
        parser.add_argument(
            "--force", action="store_true", help="even if the home balancer is down"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            moves = plan_failback(options["region"], force=options["force"])
        except FailoverError as exc:
            raise CommandError(str(exc)) from exc
        for line in describe(moves):
            self.stdout.write(line)
        self.stdout.write(f"{len(moves)} replica(s) back home")
