"""In-flight accounting: every lease is released exactly once, whatever the exit path."""

from __future__ import annotations

import pytest

from core.leases import InflightLedger, Lease
from core.types import TargetState


def test_acquire_counts_per_target_and_in_total() -> None:
    ledger = InflightLedger()
    a, b = TargetState("a", "http://a"), TargetState("b", "http://b")
    ledger.acquire(a, "r1")
    ledger.acquire(a, "r2")
    ledger.acquire(b, "r3")
    assert (a.outstanding, b.outstanding, ledger.total) == (2, 1, 3)
    assert ledger.by_target() == {"a": 2, "b": 1}


def test_release_is_idempotent_so_counters_never_drift_negative() -> None:
    ledger = InflightLedger()
    target = TargetState("a", "http://a")
    lease = ledger.acquire(target, "r1")
    assert lease.release(ok=True) is True
    # A second path (a finally after an except that already released) must be harmless.
    assert lease.release(ok=False) is False
    assert (target.outstanding, ledger.total, ledger.by_target()) == (0, 0, {})
    assert lease.ok is True


def test_release_hook_runs_once_with_the_outcome() -> None:
    seen: list[tuple[str, bool]] = []
    ledger = InflightLedger()
    lease = ledger.acquire(
        TargetState("a", "http://a"), "r1", lambda lease, ok: seen.append((lease.request_id, ok))
    )
    lease.release(ok=False)
    lease.release(ok=True)
    assert seen == [("r1", False)]


def test_count_survives_a_replaced_target_state() -> None:
    # A topology refresh builds new TargetState objects while requests still run;
    # the ledger, keyed by id, keeps the true count.
    ledger = InflightLedger()
    old = TargetState("a", "http://a")
    lease = ledger.acquire(old, "r1")
    assert ledger.outstanding("a") == 1
    lease.release(ok=True)
    assert ledger.outstanding("a") == 0


@pytest.mark.parametrize(
    "exit_path", ["success", "upstream_error", "cancelled", "exception_before_stream"]
)
def test_every_exit_path_of_a_try_finally_returns_to_zero(exit_path: str) -> None:
    ledger = InflightLedger()
    target = TargetState("a", "http://a")

    def attempt() -> None:
        lease: Lease = ledger.acquire(target, "r1")
        try:
            if exit_path == "success":
                lease.release(ok=True)
            elif exit_path == "upstream_error":
                raise ConnectionResetError("reset by peer")
            elif exit_path == "cancelled":
                raise KeyboardInterrupt  # a BaseException, like CancelledError
            else:
                raise ValueError("bug before the first byte")
        finally:
            lease.release(ok=False)

    if exit_path == "success":
        attempt()
    else:
        with pytest.raises((ConnectionResetError, KeyboardInterrupt, ValueError)):
            attempt()
    assert (target.outstanding, ledger.total) == (0, 0)
