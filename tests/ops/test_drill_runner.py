"""The drill runner's bookkeeping, without processes: reaction, outcome, SIGTERM."""

from __future__ import annotations

import json
import threading

import pytest

from fleet.models import DrillRun
from ops.drills.reactions import Reaction, ReactionCheck
from ops.drills.runner import DrillOptions, DrillPlan, run_drill
from ops.drills.stream import TrafficStream
from ops.drills.traffic import RequestRecord, TrafficConfig, split_at
from tests.support.http_server import Canned, FakeServer
from tests.support.polling import eventually


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
    assert "routing did not react within 0.1s: last check saw still there" in [
        e["event"] for e in run.timeline
    ]


@pytest.mark.django_db
def test_convergence_is_checked_after_the_fault_is_cleared() -> None:
    healed = iter([False, True])
    drill, calls = plan(lambda: Reaction(True, "cut"), restore=True)
    drill.converge, drill.converge_bound_s = (lambda: Reaction(next(healed), "whole")), 5.0
    run = run_drill(drill, DrillOptions(poll_s=0.01, after_s=0))
    assert run.outcome == DrillRun.Outcome.PASSED and calls == ["inject", "restore"]
    events = [e["event"] for e in run.timeline]
    assert events[-2] == "fault cleared: fixed it"
    assert events[-1].startswith("state converged") and events[-1].endswith(": whole")

    stuck, _ = plan(lambda: Reaction(True, "cut"), restore=True)
    stuck.converge, stuck.converge_bound_s = (lambda: Reaction(False, "apart")), 0.05
    run = run_drill(stuck, DrillOptions(poll_s=0.01, after_s=0))
    assert run.outcome == DrillRun.Outcome.NOT_CONVERGED
    assert "state did not converge within 0.1s: last check saw apart" in [
        e["event"] for e in run.timeline
    ]


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


COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "text": "hi", "finish_reason": "length", "logprobs": None}],
}
JSON = {"Content-Type": "application/json"}
ANSWERED_BY = {
    **JSON,
    "X-Meridian-Balancer": "lb-1",
    "X-Meridian-Replica": "r-1",
}


def test_traffic_counts_sdk_retries_and_who_answered() -> None:
    # A balancer mid-failover: no healthy replica at first, then an answer.
    server = FakeServer()
    server.answer_in_turn(
        "POST",
        "/v1/completions",
        Canned(503, '{"error": {"message": "no healthy replica"}}', JSON),
        Canned(200, json.dumps(COMPLETION), ANSWERED_BY),
    )
    try:
        config = TrafficConfig(api_key="k", model="m", rate=20, max_requests=1, max_retries=1)
        stream = TrafficStream(config, server.url)
        stream.start()
        eventually(lambda: stream.records, what="the request recorded")
        records = stream.stop(wait_s=30)
    finally:
        server.close()
    # The request met a 503, and the SDK's retry succeeded: "retried", not "succeeded".
    [only] = records
    assert (only.ok, only.attempts, only.outcome) == (True, 2, "retried")
    assert (only.balancer, only.replica) == ("lb-1", "r-1")


@pytest.mark.django_db
def test_a_check_that_answers_after_the_bound_fails_the_drill() -> None:
    def slow_check() -> Reaction:
        threading.Event().wait(0.2)  # started in time, answers past the 0.05 s bound
        return Reaction(True, "moved")

    drill, _ = plan(slow_check, bound_s=0.05)
    run = run_drill(drill, DrillOptions(poll_s=0.01, after_s=0))
    assert run.reaction_s is not None and run.reaction_s > run.bound_s
    assert run.outcome == DrillRun.Outcome.NO_REACTION
    assert any("(past the bound)" in e["event"] for e in run.timeline)
