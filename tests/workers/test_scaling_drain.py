"""The drain state machine (``workers.scaling.drain``): settle, drained, deadline."""

from __future__ import annotations

import pytest

from workers.scaling.drain import (
    PREEMPTION_WARNING,
    SCALE_DOWN,
    Drain,
    DrainConfig,
    Verdict,
    drains_from_state,
    drains_to_state,
    judge,
)

CONFIG = DrainConfig(settle_s=5.0, deadline_s=60.0)
DRAIN = Drain("emu-1", started_at=100.0, reason=SCALE_DOWN)


def test_an_idle_replica_waits_out_the_topology_refresh_before_it_is_terminated() -> None:
    # A balancer may still push to it until its next refresh: zero proves nothing yet.
    assert judge(DRAIN, 104.9, 0, CONFIG) is Verdict.WAIT
    assert judge(DRAIN, 105.0, 0, CONFIG) is Verdict.DRAINED


def test_requests_in_flight_hold_the_replica_until_they_finish() -> None:
    assert judge(DRAIN, 120.0, 3, CONFIG) is Verdict.WAIT
    assert judge(DRAIN, 159.9, 1, CONFIG) is Verdict.WAIT
    assert judge(DRAIN, 130.0, 0, CONFIG) is Verdict.DRAINED


def test_past_the_deadline_what_still_runs_is_cut() -> None:
    assert judge(DRAIN, 160.0, 2, CONFIG) is Verdict.DEADLINE
    # A finished replica at the deadline is drained, not cut.
    assert judge(DRAIN, 160.0, 0, CONFIG) is Verdict.DRAINED


def test_a_replica_that_does_not_answer_counts_as_busy_until_the_deadline() -> None:
    assert judge(DRAIN, 150.0, None, CONFIG) is Verdict.WAIT
    assert judge(DRAIN, 160.0, None, CONFIG) is Verdict.DEADLINE


def test_bad_input_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="negative"):
        judge(DRAIN, 120.0, -1, CONFIG)
    with pytest.raises(ValueError, match="must be >= settle_s"):
        DrainConfig(settle_s=10.0, deadline_s=5.0)
    with pytest.raises(ValueError, match="settle_s must be >= 0"):
        DrainConfig(settle_s=-1.0, deadline_s=5.0)
    with pytest.raises(ValueError, match="is not one of"):
        Drain("emu-1", 0.0, "boredom")


def test_drains_round_trip_through_the_stored_state_and_bad_entries_are_dropped() -> None:
    drains = {
        "emu-1": DRAIN,
        "emu-2": Drain("emu-2", started_at=7.5, reason=PREEMPTION_WARNING),
    }
    stored = drains_to_state(drains)
    assert stored == {
        "emu-1": {"started_at": 100.0, "reason": SCALE_DOWN},
        "emu-2": {"started_at": 7.5, "reason": PREEMPTION_WARNING},
    }
    assert drains_from_state(stored) == drains
    edited = {**stored, "emu-3": {"started_at": "soon", "reason": SCALE_DOWN}, "emu-4": 1}
    assert drains_from_state(edited) == drains
    assert drains_from_state(None) == {}
