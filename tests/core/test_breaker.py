"""The per-replica circuit breaker: hold-down, half-open trials, doubling for flapping."""

from __future__ import annotations

import pytest

from core.breaker import NO_HOLD_DOWN, Breaker, BreakerConfig, BreakerState


def breaker(hold: float = 1.0, cap: float = 8.0, readmit: int = 3) -> Breaker:
    return Breaker(BreakerConfig(hold_down_s=hold, max_hold_down_s=cap, readmit_after=readmit))


def test_good_probes_during_the_hold_down_do_not_count() -> None:
    b = breaker()
    b.failed(10.0)
    assert b.state is BreakerState.OPEN and b.open_until == 11.0
    assert not b.probe_ok(10.5) and not b.probe_ok(10.99)
    assert b.state is BreakerState.OPEN


def test_consecutive_good_trials_readmit() -> None:
    b = breaker(readmit=3)
    b.failed(0.0)
    assert [b.probe_ok(t) for t in (1.0, 1.25, 1.5)] == [False, False, True]
    assert b.closed and b.trips == 0
    assert b.probe_ok(1.75)  # closed stays closed


def test_a_failed_trial_reopens_with_a_doubled_hold_down_up_to_the_cap() -> None:
    b = breaker(hold=1.0, cap=3.0, readmit=2)
    b.failed(0.0)
    holds = []
    now = 0.0
    for _ in range(4):
        now = b.open_until
        assert not b.probe_ok(now)  # one good trial...
        b.probe_failed(now)  # ...then a failed one: a flapping replica
        holds.append(b.open_until - now)
    assert holds == [2.0, 3.0, 3.0, 3.0]


def test_a_probe_failure_on_a_closed_breaker_leaves_it_to_the_threshold() -> None:
    b = breaker()
    b.probe_failed(0.0)
    assert b.closed


def test_a_failure_while_open_extends_the_current_hold_down() -> None:
    b = breaker(hold=1.0)
    b.failed(0.0)
    b.failed(0.5)  # a request that was already in flight fails too
    assert b.open_until == 1.5 and b.trips == 1


def test_no_hold_down_readmits_on_the_first_good_probe() -> None:
    b = Breaker(NO_HOLD_DOWN)
    b.failed(5.0)
    assert b.probe_ok(5.0)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        BreakerConfig(hold_down_s=2.0, max_hold_down_s=1.0)
    with pytest.raises(ValueError):
        BreakerConfig(readmit_after=0)
