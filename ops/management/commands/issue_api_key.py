"""`manage.py issue_api_key NAME`: create a client API key and print it once."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandParser

from fleet.models import ApiKey


class Command(BaseCommand):
    help = "Issue an API key for OpenAI clients; the secret is printed once and stored hashed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who or what the key is for")

    def handle(self, *args: object, **options: object) -> None:
        key, raw = ApiKey.issue(str(options["name"]))
        self.stdout.write(
            f"Issued key {key.prefix}… for {key.name!r}. Store it now; it is not shown again:"
        )
        self.stdout.write(raw)
