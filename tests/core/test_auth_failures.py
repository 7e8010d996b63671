"""The per-source hold-down after failed API-key attempts."""

from __future__ import annotations

from core.auth_failures import AuthFailureLimiter


def test_a_source_is_held_down_after_its_allowed_failures() -> None:
    limiter = AuthFailureLimiter(max_failures=3, window_s=60)
    for second in range(3):
        assert limiter.retry_after("10.0.0.1", now=second) is None
        limiter.record_failure("10.0.0.1", now=second)
    assert limiter.retry_after("10.0.0.1", now=3) == 57  # until the first failure's window ends
    assert limiter.retry_after("10.0.0.2", now=3) is None  # others are not affected


def test_the_hold_down_ends_with_the_window() -> None:
    limiter = AuthFailureLimiter(max_failures=1, window_s=10)
    limiter.record_failure("a", now=0)
    assert limiter.retry_after("a", now=9.5) == 1
    assert limiter.retry_after("a", now=10) is None
    limiter.record_failure("a", now=10)  # a fresh window
    assert limiter.retry_after("a", now=11) == 9


def test_the_table_stays_bounded_dropping_expired_then_oldest() -> None:
    limiter = AuthFailureLimiter(max_failures=1, window_s=10, max_sources=3)
    for n, source in enumerate("abc"):
        limiter.record_failure(source, now=n)
    limiter.record_failure("d", now=10.5)  # "a" has expired: it goes
    assert len(limiter) == 3 and limiter.retry_after("a", now=10.5) is None
    limiter.record_failure("e", now=10.6)  # none expired: the oldest ("b") goes
    assert len(limiter) == 3 and limiter.retry_after("b", now=10.6) is None
    assert limiter.retry_after("c", now=10.6) == 2
