"""`manage.py failover --from REGION --to REGION`: a planned move of replica ownership.

Every replica of the first region is handed to a live balancer of the second (an
Event records it); the failover controller leaves a planned move alone until
`manage.py failback --region REGION` (or until its new owner dies).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.failover import FailoverError, Move, plan_failover


def describe(moves: list[Move]) -> list[str]:
    return [f"{m.replica}: {m.from_owner} -> {m.to_owner}" for m in moves]


class Command(BaseCommand):
    help = "Hand a region's replicas to another region's balancer (planned failover)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="source", required=True, help="region to empty")
        parser.add_argument("--to", dest="target", required=True, help="region to take over")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            moves = plan_failover(options["source"], options["target"])
        except FailoverError as exc:
            raise CommandError(str(exc)) from exc
        for line in describe(moves):
            self.stdout.write(line)
        self.stdout.write(f"{len(moves)} replica(s) moved; balancers adopt them at their refresh")
