"""`manage.py set_scaler MODEL SCALER [--prompt-tps X --decode-tps Y --total-tps Z]`:
choose how many replicas a service runs (docs/scaling.md).

``request-rate`` is SkyServe's reactive autoscaler; ``preserve`` is PreServe's instance
scaler over the workload forecast and the replicas' KV look-ahead, and needs the
replica's profiled capacity (tokens/s within the SLO).  The scaling beat reads the
choice on its next run; the change is an Event, as on the console's service page."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.models import ServiceConfig

CAPACITY = {
    "prompt_tps": "replica_prompt_tokens_per_s",
    "decode_tps": "replica_decode_tokens_per_s",
    "total_tps": "replica_total_tokens_per_s",
}


class Command(BaseCommand):
    help = "Set a service's scaler (request-rate or preserve) and its profiled capacity."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("model")
        parser.add_argument("scaler", choices=ServiceConfig.Scaler.values)
        parser.add_argument("--prompt-tps", type=float, help="prompt tokens/s of one replica")
        parser.add_argument("--decode-tps", type=float, help="decode tokens/s of one replica")
        parser.add_argument("--total-tps", type=float, help="prompt + decode tokens/s")

    def handle(self, *args: object, **options: Any) -> None:
        config = ServiceConfig.objects.filter(model_name=options["model"]).first()
        if config is None:
            raise CommandError(f"no service for model {options['model']!r}")
        before = {f: getattr(config, f) for f in ("scaler", *CAPACITY.values())}
        config.scaler = options["scaler"]
        for option, field in CAPACITY.items():
            value = options[option]
            if value is not None:
                if value <= 0:
                    raise CommandError(f"--{option.replace('_', '-')} must be positive")
                setattr(config, field, value)
        missing = [
            "--" + o.replace("_", "-") for o, f in CAPACITY.items() if getattr(config, f) is None
        ]
        if config.scaler == ServiceConfig.Scaler.PRESERVE and missing:
            raise CommandError(
                f"the preserve scaler needs the profiled per-replica capacity: {' '.join(missing)}"
            )
        config.save_recording_changes(before, actor="set_scaler")
        self.stdout.write(f"{config.model_name}: scaler {config.scaler}")
