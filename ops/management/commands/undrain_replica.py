"""`manage.py undrain_replica NAME`: put a drained replica back in service (→ ready)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.replica_states import ReplicaStateError, undrain_replica


class Command(BaseCommand):
    help = "Undrain a replica: balancers route to it again at their next topology refresh."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            old = undrain_replica(options["name"])
        except ReplicaStateError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{options['name']}: {old} -> ready")
