"""Running a drill command with its own traffic, and what "the drill passed" means."""

from __future__ import annotations

from fleet.models import DrillRun
from tests.support.commands import run_command


def run_drill(
    command: str, *args: str, traffic: int, after_s: float, verbosity: int = 1
) -> tuple[str, DrillRun]:
    """Run ``command`` with ``traffic`` requests per second (the official client,
    retries on) from half a second before the fault to ``after_s`` after the
    reaction; return what it printed and the run it recorded."""
    window = ("--traffic", str(traffic), "--warmup", "0.5", "--after", str(after_s))
    text = run_command(command, *args, *window, verbosity=verbosity)
    return text, DrillRun.objects.latest("started_at")


def assert_drill_passed(text: str, run: DrillRun) -> None:
    """Routing reacted within the bound the configured periods give, and no request
    sent after the reaction failed (a retried one counts as served)."""
    assert run.outcome == DrillRun.Outcome.PASSED, text
    assert run.reaction_s is not None and run.reaction_s <= run.bound_s
    assert run.failed_after == 0 and run.succeeded_after + run.retried_after > 0
