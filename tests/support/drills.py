"""Running a drill command with its own traffic, and what "the drill passed" means."""

from __future__ import annotations

import io

from django.core.management import call_command
from django.core.management.base import CommandError

from fleet.models import DrillRun


def run_drill(
    command: str, *args: str, traffic: int, after_s: float, verbosity: int = 1
) -> tuple[str, DrillRun]:
    """Run ``command`` with ``traffic`` requests per second (the official client,
    retries on) from half a second before the fault to ``after_s`` after the
    reaction; return what it printed and the run it recorded.  A drill that did not
    pass fails the test with its whole printed timeline, not just its outcome."""
    window = ("--traffic", str(traffic), "--warmup", "0.5", "--after", str(after_s))
    out = io.StringIO()
    try:
        call_command(command, *args, *window, verbosity=verbosity, stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        raise AssertionError(f"{exc}\n{out.getvalue()}") from exc
    return out.getvalue(), DrillRun.objects.latest("started_at")


def assert_drill_passed(text: str, run: DrillRun) -> None:
    """Routing reacted within the bound the configured periods give, and no request
    sent after the reaction failed (a retried one counts as served)."""
    assert run.outcome == DrillRun.Outcome.PASSED, text
    assert run.reaction_s is not None and run.reaction_s <= run.bound_s
    assert run.failed_after == 0 and run.succeeded_after + run.retried_after > 0
