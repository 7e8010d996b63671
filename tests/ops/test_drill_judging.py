"""A drill's verdict agrees with its own reaction time and bound (pure judging)."""

from __future__ import annotations

import pytest

from ops.drills.judging import (
    ABORTED,
    FAILED_AFTER_REACTION,
    NO_REACTION,
    NOT_CONVERGED,
    PASSED,
    DrillReport,
    PhaseCounts,
    judge,
    render,
    traffic_share,
)


@pytest.mark.parametrize(
    ("reaction_s", "bound_s"),
    [
        (16.25, 14.2),  # kill-balancer once reported passed at this reaction
        (7.64, 7.2),  # preempt: the deadline was read before the slow check
        (7.2001, 7.2),
    ],
)
def test_a_reaction_past_its_bound_fails(reaction_s: float, bound_s: float) -> None:
    verdict = judge(reaction_s=reaction_s, bound_s=bound_s, failed_after=0)
    assert verdict.outcome == NO_REACTION
    assert f"{reaction_s:.2f}s" in verdict.why and f"{bound_s:.2f}s" in verdict.why


def test_a_reaction_within_its_bound_passes_only_when_nothing_failed_after() -> None:
    assert judge(reaction_s=7.2, bound_s=7.2, failed_after=0).outcome == PASSED
    assert judge(reaction_s=3.0, bound_s=7.2, failed_after=2).outcome == FAILED_AFTER_REACTION


def test_lateness_outranks_what_happened_after() -> None:
    late = judge(reaction_s=9.0, bound_s=7.2, failed_after=3, converged=False)
    assert late.outcome == NO_REACTION


def test_no_reaction_convergence_and_abort() -> None:
    assert judge(reaction_s=None, bound_s=5, failed_after=0).outcome == NO_REACTION
    assert judge(reaction_s=1, bound_s=5, failed_after=0, converged=False).outcome == NOT_CONVERGED
    assert judge(reaction_s=1, bound_s=5, failed_after=0, aborted=True).outcome == ABORTED


def test_traffic_share_sees_a_replica_left_alone() -> None:
    before = {"a": 10, "b": 10, "c": 10}
    share = traffic_share(before, {"a": 30, "b": 29, "c": 11}, "c", min_before=8)
    assert share is not None
    assert (share.dispatched, share.to_replica, share.replicas) == (40, 1, 3)
    assert share.moved_away(min_dispatched=20)
    assert "c got 1 of 40" in share.describe("c") and "33% before it" in share.describe("c")


def test_a_favourite_losing_most_of_its_traffic_has_moved_even_above_its_fair_share() -> None:
    # Least-load sent ties to r1 before the fault; slowed, it keeps 31 %, not 98 %.
    share = traffic_share({"r1": 49, "r2": 1, "r3": 0}, {"r1": 63, "r2": 17, "r3": 15}, "r1")
    assert share is not None and share.usual == pytest.approx(0.98)
    assert share.moved_away(min_dispatched=8)


def test_traffic_share_needs_enough_requests_and_a_real_drop() -> None:
    even = traffic_share({}, {"a": 10, "b": 10, "c": 9}, "c")
    assert even is not None and even.usual is None and not even.moved_away(min_dispatched=20)
    few = traffic_share({}, {"a": 3, "b": 3, "c": 0}, "c")
    assert few is not None and not few.moved_away(min_dispatched=20)
    alone = traffic_share({}, {"c": 0}, "c")
    assert alone is not None and not alone.moved_away(min_dispatched=0)
    assert traffic_share({}, {"a": 1}, "c") is None
    # Too little before the fault to know its usual share: the fair share stands in.
    thin = traffic_share({"a": 1, "c": 1}, {"a": 21, "c": 3}, "c", min_before=8)
    assert thin is not None and thin.usual is None and thin.moved_away(min_dispatched=8)


def test_every_report_says_what_it_measured_and_why_it_judged_so() -> None:
    report = DrillReport(
        kind="kill-balancer",
        number=4,
        target="lb-a",
        bound_s=14.2,
        reaction_s=16.25,
        outcome=NO_REACTION,
        timeline=[(0.0, "fault injected: SIGKILL lb-a")],
        before=PhaseCounts(5, 0, 0),
        after=PhaseCounts(7, 1, 0),
    )
    text = render(report)
    assert "measured: seconds from SIGKILL until a live balancer routes" in text
    assert "reaction: 16.25s (bound 14.20s)" in text
    assert "outcome: no-reaction (routing reacted after 16.25s, past its 14.20s bound)" in text
    assert "  +   0.00s  fault injected: SIGKILL lb-a" in text
