"""The probe loop's schedule: a round every tick under traffic; idle, the gap doubles."""

from __future__ import annotations

import pytest

from core.probe_schedule import ProbeSchedule


def _rounds(schedule: ProbeSchedule, ticks: int, acquired: int = 0) -> str:
    return "".join("P" if schedule.tick(acquired, busy=False) else "." for _ in range(ticks))


def test_idle_gaps_double_up_to_the_cap() -> None:
    schedule = ProbeSchedule(0.25, 2.0)
    # Ticks every 0.25 s: rounds after gaps of 0.25, 0.5, 1, 2, 2 s.
    assert _rounds(schedule, 24) == "PP.P...P.......P.......P"
    assert schedule.gap_s == 2.0


def test_the_first_tick_that_sees_traffic_probes_at_once_and_resets_the_gap() -> None:
    schedule = ProbeSchedule(0.25, 2.0)
    _rounds(schedule, 20)
    assert schedule.tick(0, busy=False) is False  # mid-gap, quiet
    # A request that came and went between two ticks counts as traffic.
    assert schedule.tick(1, busy=False) is True
    assert schedule.gap_s == 0.25
    assert _rounds(schedule, 3, acquired=1) == "P.P"
    # So does one in flight or queued, with no new arrival.
    assert schedule.tick(1, busy=True) is True
    assert schedule.tick(1, busy=True) is True


def test_a_cap_equal_to_the_interval_probes_every_tick() -> None:
    schedule = ProbeSchedule(0.25, 0.25)
    assert _rounds(schedule, 6) == "PPPPPP"


def test_the_cap_cannot_be_below_the_interval_nor_the_interval_zero() -> None:
    with pytest.raises(ValueError, match="at least the probe interval"):
        ProbeSchedule(0.5, 0.25)
    with pytest.raises(ValueError, match="positive"):
        ProbeSchedule(0.0, 1.0)
