"""Retry backoff: exponential ceilings, full jitter from an injected source."""

from __future__ import annotations

import itertools

import pytest

from core.backoff import NO_BACKOFF, RetryBackoff


def test_ceilings_double_up_to_the_cap() -> None:
    backoff = RetryBackoff(base_s=0.1, max_s=0.5)
    assert [backoff.ceiling(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.4, 0.5]


def test_the_delay_is_the_injected_fraction_of_the_ceiling() -> None:
    fractions = itertools.cycle([0.0, 0.5, 0.999])
    backoff = RetryBackoff(base_s=0.2, max_s=1.0, uniform=lambda: next(fractions))
    assert [backoff.delay(2) for _ in range(3)] == [0.0, 0.2, 0.4 * 0.999]


def test_the_default_source_is_seeded_so_runs_repeat() -> None:
    first, again = RetryBackoff(), RetryBackoff()
    delays = [first.delay(3) for _ in range(5)]
    assert delays == [again.delay(3) for _ in range(5)]
    assert all(0 <= d < first.ceiling(3) for d in delays) and len(set(delays)) == 5


def test_no_backoff_never_waits_and_bad_bounds_are_refused() -> None:
    assert NO_BACKOFF.delay(5) == 0.0
    with pytest.raises(ValueError):
        RetryBackoff(base_s=1.0, max_s=0.5)
