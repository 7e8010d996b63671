"""A drill's record as the text its command prints."""

from __future__ import annotations

from fleet.models import DrillRun


def format_run(run: DrillRun) -> str:
    reaction = f"{run.reaction_s:.2f}s" if run.reaction_s is not None else "none"
    lines = [
        f"drill {run.kind} #{run.pk}: {run.target}",
        f"reaction: {reaction} (bound {run.bound_s:.1f}s)",
        "timeline:",
    ]
    lines += [f"  +{float(e['t']):7.2f}s  {e['event']}" for e in run.timeline]
    lines += [
        "requests (by when sent)   succeeded  retried  failed",
        f"  before the reaction     {run.succeeded_before:9d}  {run.retried_before:7d}"
        f"  {run.failed_before:6d}",
        f"  after the reaction      {run.succeeded_after:9d}  {run.retried_after:7d}"
        f"  {run.failed_after:6d}",
        f"outcome: {run.outcome}",
    ]
    return "\n".join(lines)
