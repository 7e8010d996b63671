"""`manage.py issue_api_key NAME [limits]`: create a client API key and print it once."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.key_limits import BUDGET_PERIODS, KeyLimits, parse_limit, parse_models
from fleet.models import ApiKey

LIMIT_OPTIONS = {
    "rpm": ("requests_per_minute", "requests per minute"),
    "tpm": ("tokens_per_minute", "tokens per minute (prompt + completion)"),
    "max_concurrent": ("max_concurrent", "requests in flight at once"),
    "token_budget": ("token_budget", "tokens per budget period"),
}


class Command(BaseCommand):
    help = (
        "Issue an API key for OpenAI clients; the secret is printed once and stored hashed. "
        "Limits are optional (none: unlimited) and hold across every balancer."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who or what the key is for")
        for option, (_, what) in LIMIT_OPTIONS.items():
            parser.add_argument(
                f"--{option.replace('_', '-')}", dest=option, metavar="N", help=f"limit: {what}"
            )
        parser.add_argument(
            "--budget-period",
            default="month",
            metavar="PERIOD",
            help=f"the token budget's period: {', '.join(BUDGET_PERIODS)} (default month, 30 days)",
        )
        parser.add_argument(
            "--models",
            default="",
            metavar="A,B",
            help="comma-separated models the key may use (default: all)",
        )

    def handle(self, *args: object, **options: object) -> None:
        name = str(options["name"]).strip()
        if not name:
            raise CommandError("The key needs a name.")
        try:
            values = {
                field: parse_limit(f"--{option.replace('_', '-')}", _text(options.get(option)))
                for option, (field, _) in LIMIT_OPTIONS.items()
            }
            limits = KeyLimits(
                budget_period=str(options["budget_period"]),
                allowed_models=parse_models(str(options["models"] or "")),
                **values,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        key, raw = ApiKey.issue(name, limits)
        self.stdout.write(
            f"Issued key {key.prefix}… for {key.name!r}. Store it now; it is not shown again:"
        )
        if limits.counted or limits.allowed_models:
            self.stdout.write(f"Limits: {describe(limits)}")
        self.stdout.write(raw)  # last, alone on its line: scripts take the last line


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def describe(limits: KeyLimits) -> str:
    parts = []
    if limits.requests_per_minute is not None:
        parts.append(f"{limits.requests_per_minute} requests/min")
    if limits.tokens_per_minute is not None:
        parts.append(f"{limits.tokens_per_minute} tokens/min")
    if limits.max_concurrent is not None:
        parts.append(f"{limits.max_concurrent} concurrent")
    if limits.token_budget is not None:
        parts.append(f"{limits.token_budget} tokens per {limits.budget_period}")
    if limits.allowed_models:
        parts.append("models " + ", ".join(sorted(limits.allowed_models)))
    return "; ".join(parts)
