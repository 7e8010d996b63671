"""Fixtures shared by the whole suite: a real Redis and real child processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from console.embedded_redis import EmbeddedRedis, ensure_redis
from tests.support.django_env import child_process_env
from tests.support.processes import ProcessGroup


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    """A Redis at settings.REDIS_URL: the machine's own, or an embedded one started here."""
    handle = ensure_redis(settings.REDIS_URL, data_dir=Path(settings.VAR_DIR) / "test-redis")
    yield handle
    handle.stop()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessGroup]:
    """Start child processes; every one is stopped when the test ends, pass or fail."""
    group = ProcessGroup(tmp_path / "logs")
    yield group
    group.stop_all()


@pytest.fixture
def django_subprocess_env(redis_server: EmbeddedRedis, db: None) -> dict[str, str]:
    """Environment for a child process (balancer, worker, command) that must see the very
    database and Redis this test uses.  Pair it with ``django_db(transaction=True)`` so
    what the test writes is committed and visible to the child."""
    return child_process_env(redis_server.url)
