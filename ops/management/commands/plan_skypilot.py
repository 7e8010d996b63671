"""`manage.py plan_skypilot --zone Z --kind spot|on-demand`: the SkyPilot provider's dry run.

Prints the task YAML one replica's launch would submit and the SDK calls the provider
would make for it, touching no cloud.  ``--validate`` also hands the task to SkyPilot's
own parser (``sky.Task.from_yaml_config``, in SkyPilot's environment) and prints the
resources SkyPilot read from it: a typo in an accelerator or a zone fails here, not in
the first beat that launches.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.providers.factory import skypilot_bridge, skypilot_config
from workers.providers.skypilot import SkyPilotError
from workers.providers.skypilot_plan import (
    KINDS,
    plan_lines,
    task_config,
    to_yaml,
)


class Command(BaseCommand):
    help = "Print the SkyPilot task and the calls one replica's launch makes; launch nothing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--zone", required=True, help="a zone of MERIDIAN_SKYPILOT_ZONES")
        parser.add_argument("--kind", choices=KINDS, default="spot")
        parser.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct")
        parser.add_argument("--replica", default="dry-run", help="the replica's name")
        parser.add_argument(
            "--zones", default="", help="cloud/region/zone,... instead of MERIDIAN_SKYPILOT_ZONES"
        )
        parser.add_argument(
            "--validate", action="store_true", help="also parse the task with SkyPilot itself"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            config = skypilot_config(options["zones"] or None)
            task = task_config(
                config, options["model"], options["replica"], options["zone"], options["kind"]
            )
            steps = plan_lines(
                config, options["model"], options["replica"], options["zone"], options["kind"]
            )
        except (KeyError, ValueError) as exc:
            raise CommandError(str(exc).strip("'\"")) from exc
        self.stdout.write("# task YAML (dry run: nothing is launched)")
        self.stdout.write(to_yaml(task))
        self.stdout.write("\n# plan")
        self.stdout.write("\n".join(steps))
        if options["validate"]:
            self.stdout.write("\n# as SkyPilot parsed it")
            self.stdout.write(self.validated(task))

    def validated(self, task: dict[str, Any]) -> str:
        try:
            bridge = skypilot_bridge()
        except SkyPilotError as exc:
            raise CommandError(str(exc)) from exc
        try:
            parsed = bridge.call("render", task=task)
            version = bridge.call("version")["version"]
        except SkyPilotError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            bridge.close()
        lines = [f"# SkyPilot {version}", to_yaml(parsed["config"])]
        lines += [f"# resources: {r}" for r in parsed["resources"]]
        return "\n".join(lines)
