"""`manage.py set_policy MODEL POLICY [--param key=value ...]`: switch a service's routing."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.registry import policy_names
from workers.policy_config import PolicyConfigError, set_policy


def parse_param(raw: str) -> tuple[str, Any]:
    """``key=value`` with the value read as JSON when it parses (numbers, booleans),
    else as a string: ``--param pushing=sp-o --param vnodes=64``."""
    key, sep, value = raw.partition("=")
    if not sep or not key:
        raise CommandError(f"--param {raw!r}: expected key=value")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


class Command(BaseCommand):
    help = "Set a service's routing policy and parameters; running balancers follow in seconds."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("model")
        parser.add_argument("policy", help=f"one of: {', '.join(policy_names())}")
        parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE")

    def handle(self, *args: object, **options: Any) -> None:
        params = dict(parse_param(raw) for raw in options["param"])
        try:
            config = set_policy(options["model"], options["policy"], params, actor="set_policy")
        except PolicyConfigError as exc:
            raise CommandError(str(exc)) from exc
        shown = json.dumps(config.policy_params, sort_keys=True)
        self.stdout.write(f"{config.model_name}: policy {config.policy} {shown}")
