"""The demo supervisor's restart policy: bounded attempts after a doubling backoff."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from ops.stack.supervisor import Child, ChildSpec, RestartPolicy, Supervisor
from tests.support.polling import eventually

EXIT_AT_ONCE = (sys.executable, "-c", "print('up'); raise SystemExit(3)")


def run_until(
    supervisor: Supervisor, done: Callable[[], bool], timeout: float = 10.0
) -> list[Child]:
    """Drive the supervisor's watch loop (as run_demo does) until ``done()``."""
    restarted: list[Child] = []

    def watch() -> bool:
        supervisor.exited()
        restarted.extend(supervisor.restart_due())
        return done()

    eventually(watch, what="the supervisor got there", timeout=timeout, interval=0.02)
    return restarted


def test_restartable_child_comes_back_until_attempts_run_out(tmp_path: Path) -> None:
    policy = RestartPolicy(attempts=2, backoff_s=0.05)
    supervisor = Supervisor(tmp_path, tmp_path, restart_policy=policy)
    try:
        flaky = supervisor.start(ChildSpec("flaky", EXIT_AT_ONCE, restart=True))
        once = supervisor.start(ChildSpec("once", EXIT_AT_ONCE))
        restarted = run_until(supervisor, lambda: supervisor.gave_up(flaky))
        assert [c.spec.name for c in restarted] == ["flaky", "flaky"]
        assert flaky.restarts == 2
        assert (tmp_path / "flaky.log").read_text().count("up") == 3  # one log, appended
        assert once.restarts == 0 and not supervisor.gave_up(once)
    finally:
        supervisor.stop_all(grace_s=2)


def test_an_exit_not_yet_handled_is_not_giving_up(tmp_path: Path) -> None:
    policy = RestartPolicy(attempts=1, backoff_s=0.05)
    supervisor = Supervisor(tmp_path, tmp_path, restart_policy=policy)
    try:
        child = supervisor.start(ChildSpec("flaky", EXIT_AT_ONCE, restart=True))
        child.process.wait()  # dead, but the watch loop has not looked yet
        assert not supervisor.gave_up(child)
        assert supervisor.exited() == [child]
        assert not supervisor.gave_up(child)  # its one restart is scheduled
    finally:
        supervisor.stop_all(grace_s=2)


def test_backoff_doubles_and_is_capped() -> None:
    policy = RestartPolicy(backoff_s=2, max_backoff_s=10)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [2, 4, 8, 10]


def test_a_child_that_stayed_up_counts_attempts_afresh(tmp_path: Path) -> None:
    policy = RestartPolicy(attempts=1, backoff_s=0.01, stable_s=0.0)
    supervisor = Supervisor(tmp_path, tmp_path, restart_policy=policy)
    try:
        child = supervisor.start(ChildSpec("stable", EXIT_AT_ONCE, restart=True))
        # With stable_s=0 every run counts as stable, so one attempt is never used up.
        run_until(supervisor, lambda: (tmp_path / "stable.log").read_text().count("up") >= 3)
        assert not supervisor.gave_up(child)
    finally:
        supervisor.stop_all(grace_s=2)
