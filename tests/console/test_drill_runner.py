"""The drill runner's bookkeeping, without processes: reaction, outcome, SIGTERM."""

from __future__ import annotations

import threading

import pytest

from console.drills.reactions import Reaction, ReactionCheck
from console.drills.runner import DrillOptions, DrillPlan, run_drill
from console.drills.traffic import RequestRecord, split_at
from console.models import DrillRun


def plan(
    check: ReactionCheck, *, restore: bool = False, bound_s: float = 5.0
) -> tuple[DrillPlan, list[str]]:
    calls: list[str] = []

    def inject() -> str:
        calls.append("inject")
        return "broke it"

    def undo() -> str:
        calls.append("restore")
        return "fixed it"

    drill = DrillPlan(
        kind=DrillRun.Kind.SLOW_REPLICA,
        target="r1",
        bound_s=bound_s,
        inject=inject,
        check=check,
        restore=undo if restore else None,
    )
    return drill, calls


@pytest.mark.django_db
def test_reaction_after_a_few_polls_passes() -> None:
    polls = iter([False, False, True])
    drill, calls = plan(lambda: Reaction(next(polls), "moved"), restore=True)
    run = run_drill(drill, DrillOptions(poll_s=0.01, after_s=0))
    assert run.outcome == DrillRun.Outcome.PASSED
    assert run.reaction_s is not None and 0 < run.reaction_s < run.bound_s
    assert calls == ["inject", "restore"]
    events = [e["event"] for e in run.timeline]
    assert events[0] == "fault injected: broke it"
    assert events[1].startswith("routing reacted after") and events[1].endswith(": moved")
    assert events[-1] == "fault cleared: fixed it"


@pytest.mark.django_db
def test_no_reaction_within_the_bound() -> None:
    drill, _ = plan(lambda: Reaction(False, "still there"), bound_s=0.1)
    run = run_drill(drill, DrillOptions(poll_s=0.01))
    assert (run.outcome, run.reaction_s) == (DrillRun.Outcome.NO_REACTION, None)
    assert "routing did not react within 0.1s" in [e["event"] for e in run.timeline]


@pytest.mark.django_db
def test_stop_ends_the_drill_restores_and_records_it_aborted() -> None:
    stop = threading.Event()
    drill, calls = plan(lambda: Reaction(False, "waiting"), restore=True, bound_s=60)
    threading.Timer(0.1, stop.set).start()  # what the command's SIGTERM handler does
    run = run_drill(drill, DrillOptions(poll_s=0.01), stop=stop)
    assert run.outcome == DrillRun.Outcome.ABORTED and run.ended_at is not None
    assert calls == ["inject", "restore"]


@pytest.mark.django_db
def test_a_failing_injection_is_recorded_and_raised() -> None:
    def inject() -> str:
        raise OSError("replica unreachable")

    drill = DrillPlan("preempt", "r1", 1.0, inject, lambda: Reaction(True, ""))
    with pytest.raises(OSError):
        run_drill(drill, DrillOptions())
    assert DrillRun.objects.get().outcome == DrillRun.Outcome.ABORTED


def record(n: int, sent_at: float, ok: bool, attempts: int = 1) -> RequestRecord:
    return RequestRecord(n, sent_at, sent_at + 0.1, ok, attempts, "http://lb")


def test_requests_are_split_by_when_they_were_sent() -> None:
    records = [
        record(0, 1.0, True),
        record(1, 2.0, False, attempts=3),
        record(2, 2.9, True, attempts=2),  # sent before, answered after: still "before"
        record(3, 3.0, True),
        record(4, 4.0, True, attempts=2),
    ]
    assert split_at(records, 3.0) == {
        "before": {"succeeded": 1, "retried": 1, "failed": 1},
        "after": {"succeeded": 1, "retried": 1, "failed": 0},
    }
    assert split_at(records, None)["after"] == {"succeeded": 0, "retried": 0, "failed": 0}
