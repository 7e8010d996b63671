"""Every drill the project has, discovered from its ``drill_*`` management commands.

A drill command exposes ``prepare(options) -> (plan, region, model)`` (see
``ops.drills.cli``); the console builds the same plan from the same parser, so a
button and ``manage.py drill_…`` run one code path, and a new drill command shows up
here without this module changing.  Its form is derived from the command's
arguments: a target picked from the topology (``--replica``, ``--zone``,
``--region``, ``--balancer``) plus its other options with their defaults.  Traffic
options are the CLI's (the console watches the operator's real traffic instead).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.management import get_commands, load_command_class
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from console.live.publish import publish_drill
from fleet.models import Balancer, Region, Replica, Zone
from ops.drills.runner import DrillOptions, run_drill
from ops.drills.targets import DrillError
from workers.ownership import serving_balancer_url

# Arguments every Django command has, and the CLI's traffic options.
_SKIPPED = {
    "help", "version", "verbosity", "settings", "pythonpath", "traceback", "no_color",
    "force_color", "skip_checks", "traffic", "max_requests", "api_key", "model", "warmup",
    "after",
}  # fmt: skip
TARGETS: dict[str, Callable[[], list[str]]] = {
    "replica": lambda: list(
        Replica.objects.filter(state=Replica.State.READY).values_list("name", flat=True)
    ),
    "zone": lambda: list(Zone.objects.values_list("name", flat=True)),
    "region": lambda: list(Region.objects.values_list("name", flat=True)),
    "balancer": lambda: list(Balancer.objects.values_list("name", flat=True)),
}


@dataclass
class DrillOption:
    dest: str
    flag: str
    help: str
    default: Any


@dataclass
class DrillSpec:
    name: str  # the command, e.g. drill_preempt
    help: str
    targets: list[tuple[str, str]] = field(default_factory=list)  # (flag, value)
    options: list[DrillOption] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.name.removeprefix("drill_").replace("_", " ")


def _command(name: str) -> BaseCommand:
    return load_command_class(get_commands()[name], name)


def drill_specs() -> list[DrillSpec]:
    """Each ``drill_*`` command that can prepare a plan, with its form."""
    specs = []
    for name in sorted(n for n in get_commands() if n.startswith("drill_")):
        command = _command(name)
        if not callable(getattr(command, "prepare", None)):
            continue
        spec = DrillSpec(name, command.help)
        for action in command.create_parser("manage.py", name)._actions:
            if action.dest in _SKIPPED or not action.option_strings:
                continue
            flag = action.option_strings[-1]
            if action.dest in TARGETS:
                spec.targets += [(flag, value) for value in TARGETS[action.dest]()]
            else:
                spec.options.append(
                    DrillOption(action.dest, flag, action.help or "", action.default)
                )
        specs.append(spec)
    return specs


def drill_argv(spec_name: str, target: str, values: dict[str, str]) -> list[str]:
    """Command-line arguments from the posted form (``target`` is ``--flag=value``)."""
    flag, _, value = target.partition("=")
    argv = [flag, value] if flag.startswith("--") and value else []
    for key, raw in values.items():
        if raw.strip():
            argv += [f"--{key.replace('_', '-')}", raw.strip()]
    return argv


def start_drill(name: str, argv: list[str]) -> str:
    """Parse like the CLI (errors raise ``CommandError`` at once), then run the drill in
    a thread, publishing each timeline line to the drills group; returns the run id."""
    if not name.startswith("drill_") or name not in get_commands():
        raise CommandError(f"no drill command {name!r}")
    command = _command(name)
    options = vars(command.create_parser("manage.py", name).parse_args(argv))
    run_id = uuid.uuid4().hex[:12]
    thread = threading.Thread(
        target=_run, args=(command, name, options, run_id), name=f"drill-{run_id}", daemon=True
    )
    thread.start()
    return run_id


def _run(command: Any, name: str, options: dict[str, Any], run_id: str) -> None:
    def say(text: str, *, done: bool = False, outcome: str = "") -> None:
        publish_drill(
            {"run": run_id, "drill": name, "t": 0.0, "text": text, "done": done, "outcome": outcome}
        )

    try:
        plan, region, _model = command.prepare(options)
        drill_options = DrillOptions(
            resolve_url=lambda: serving_balancer_url(region),
            poll_s=settings.MERIDIAN_DRILL_POLL_INTERVAL_S,
        )
        say(f"{name} on {plan.target}: bound {plan.bound_s:.1f}s")
        run = run_drill(plan, drill_options, echo=say)
        say(f"drill #{run.pk} {run.outcome}", done=True, outcome=str(run.outcome))
    except (DrillError, CommandError, OSError) as exc:
        say(f"drill refused or aborted: {exc}", done=True, outcome="aborted")
    finally:
        connection.close()  # this thread's own connection
