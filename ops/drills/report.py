"""A drill's record as the text its command prints: every kind in one format
(``ops.drills.judging.DrillReport``, rendered by ``ops.drills.judging.render``)."""

from __future__ import annotations

from fleet.models import DrillRun
from ops.drills.judging import DrillReport, PhaseCounts, render


def report_of(run: DrillRun) -> DrillReport:
    return DrillReport(
        kind=run.kind,
        number=run.pk,
        target=run.target,
        bound_s=run.bound_s,
        reaction_s=run.reaction_s,
        outcome=run.outcome,
        timeline=[(float(e["t"]), str(e["event"])) for e in run.timeline],
        before=PhaseCounts(run.succeeded_before, run.retried_before, run.failed_before),
        after=PhaseCounts(run.succeeded_after, run.retried_after, run.failed_after),
    )


def format_run(run: DrillRun) -> str:
    return render(report_of(run))
