"""`manage.py drain_replica NAME`: stop sending new requests to a replica (ready → draining)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.replica_states import ReplicaStateError, drain_replica


class Command(BaseCommand):
    help = "Drain a replica: balancers stop routing to it at their next topology refresh."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            old = drain_replica(options["name"])
        except ReplicaStateError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{options['name']}: {old} -> draining")
