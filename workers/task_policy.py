"""How every control-plane Celery task is registered and reaches Redis.

One retry policy for all of them: the failures a task should outlive are transient
(Redis restarting, a socket refused or timing out mid-probe), so they are retried
with exponential backoff and jitter (a worker pool coming back after an outage does
not retry in lockstep), at most ``MAX_RETRIES`` times.  Anything else is a bug and
fails the task at once.  A retry keeps the message's original ``expires`` (Celery
copies it onto the retried message) and every beat entry expires before its next run
(``workers.schedule``), so a periodic task's retries never outlive the next beat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import redis
from celery import Task, shared_task
from django.conf import settings

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    redis.ConnectionError,
    redis.TimeoutError,
)
MAX_RETRIES = 3
RETRY_POLICY: dict[str, Any] = {
    "autoretry_for": TRANSIENT_ERRORS,
    "retry_backoff": True,  # 1 s, 2 s, 4 s … before jitter
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": MAX_RETRIES,
}

# Short: a task waiting on a stalled Redis would hold a worker slot past its expiry.
REDIS_TIMEOUT_S = 2.0


P = ParamSpec("P")
R = TypeVar("R")


def control_task(**options: Any) -> Callable[[Callable[P, R]], Task[P, R]]:
    """``shared_task`` with the retry policy; ``options`` may add to it, not change it
    (repeating one of its keys is a ``TypeError``)."""
    # Options passed as a dict pick none of shared_task's overloads; this is the one
    # they amount to (no ``bind``, no ``base``).
    decorator: Callable[[Callable[P, R]], Task[P, R]] = shared_task(**RETRY_POLICY, **options)
    return decorator


@contextmanager
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
    )
    try:
        yield client
    finally:
        client.close()
