"""Waiting for something a test cannot be told about directly (a process ready, a
state converged): poll until it holds.  A readiness wait, never a timing claim."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

import httpx

from tests.support.processes import ProcessGroup

T = TypeVar("T")


def eventually(
    check: Callable[[], T], *, what: str, timeout: float = 20.0, interval: float = 0.05
) -> T:
    """Call ``check`` every ``interval`` seconds until it returns something truthy,
    and return that.  A server that does not answer yet counts as not yet; any
    other exception (an assertion that a child process is still alive) ends the
    wait at once."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except httpx.HTTPError as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        time.sleep(interval)
    raise AssertionError(f"{what}: still not true after {timeout}s (last: {last!r})")


def log_shows(
    group: ProcessGroup,
    name: str,
    process: subprocess.Popen[bytes],
    pattern: str,
    *,
    timeout: float = 30.0,
) -> str:
    """Wait until child ``name``'s log matches ``pattern`` (a regular expression) and
    return the log.  The child exiting first fails the test at once, with its log."""

    def shown() -> str:
        if process.poll() is not None:
            raise AssertionError(f"{name} exited with {process.returncode}")
        log = group.log_of(name)
        return log if re.search(pattern, log) else ""

    try:
        return eventually(shown, what=f"{name} printed {pattern!r}", timeout=timeout, interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its log ends:\n{group.log_of(name)[-3000:]}") from None
