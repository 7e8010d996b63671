"""The probe loop's schedule: the base interval under traffic, doubling up to a cap idle."""

from __future__ import annotations

import pytest

from routing.core.probe_schedule import ProbeSchedule


def test_idle_rounds_double_the_wait_up_to_the_cap_and_traffic_resets_it() -> None:
    schedule = ProbeSchedule(0.25, 2.0)
    assert schedule.next_delay(0, busy=False) == 0.25  # the first round: nothing known yet
    assert [schedule.next_delay(0, busy=False) for _ in range(5)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    # A request that came and went between two rounds counts as traffic.
    assert schedule.next_delay(1, busy=False) == 0.25
    assert schedule.next_delay(1, busy=False) == 0.5
    # So does one in flight or queued, with no new arrival.
    assert schedule.next_delay(1, busy=True) == 0.25
    assert schedule.next_delay(1, busy=True) == 0.25


def test_a_cap_equal_to_the_interval_turns_the_backoff_off() -> None:
    schedule = ProbeSchedule(0.25, 0.25)
    assert [schedule.next_delay(0, busy=False) for _ in range(4)] == [0.25] * 4


def test_the_cap_cannot_be_below_the_interval_nor_the_interval_zero() -> None:
    with pytest.raises(ValueError, match="at least the probe interval"):
        ProbeSchedule(0.5, 0.25)
    with pytest.raises(ValueError, match="positive"):
        ProbeSchedule(0.0, 1.0)
