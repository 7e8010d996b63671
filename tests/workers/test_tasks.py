"""The control plane's Celery tasks: registered in one place, under one retry policy.

Tasks are run with ``apply()`` (in this process, retries included), so a retry is
observed as another call of the service function the task wraps.
"""

from __future__ import annotations

import pytest
import redis
from celery import Task

import workers.tasks
from meridian.celery import app
from workers.schedule import beat_schedule
from workers.task_policy import MAX_RETRIES, TRANSIENT_ERRORS, control_task
from workers.tasks import prune_rollups


def our_tasks() -> dict[str, Task]:
    app.loader.import_default_modules()
    return {n: t for n, t in app.tasks.items() if n.split(".")[0] in {"workers", "console"}}


def test_tasks_live_in_one_module_and_share_the_retry_policy() -> None:
    tasks = our_tasks()
    # The console has none: its live numbers come from the balancers' own streams.
    assert {name.rsplit(".", 1)[0] for name in tasks} == {"workers.tasks"}
    assert {entry["task"] for entry in beat_schedule().values()} <= set(tasks)
    for task in tasks.values():
        assert task.autoretry_for == TRANSIENT_ERRORS
        assert task.max_retries == MAX_RETRIES
        assert task.retry_backoff and task.retry_jitter


def test_the_policy_cannot_be_loosened_per_task() -> None:
    with pytest.raises(TypeError):
        control_task(max_retries=10)


def flaky(monkeypatch: pytest.MonkeyPatch, *errors: Exception) -> list[int]:
    """Make ``prune_rollups``'s service raise ``errors`` in turn, then succeed."""
    calls: list[int] = []

    def service(*, retention_s: int) -> int:
        calls.append(retention_s)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return 7

    monkeypatch.setattr(workers.tasks, "prune_rollups_service", service)
    return calls


def test_a_redis_blip_is_retried_and_the_beat_still_does_its_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = flaky(monkeypatch, redis.ConnectionError("loading"), ConnectionRefusedError())
    result = prune_rollups.apply()
    assert result.successful() and result.get() == 7
    assert len(calls) == 3


def test_retries_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = flaky(monkeypatch, *[OSError("unreachable")] * (MAX_RETRIES + 5))
    result = prune_rollups.apply()
    assert result.failed() and isinstance(result.result, OSError)
    assert len(calls) == 1 + MAX_RETRIES


def test_a_bug_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = flaky(monkeypatch, KeyError("retention"))
    result = prune_rollups.apply()
    assert result.failed() and isinstance(result.result, KeyError)
    assert len(calls) == 1
