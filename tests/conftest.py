"""Fixtures shared by the whole suite: a real Redis, real child processes and the
demo's fleet as rows."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from ops.embedded_redis import EmbeddedRedis, ensure_redis
from tests.support.demo_fleet import seed_demo_fleet
from tests.support.django_env import child_process_env
from tests.support.processes import ProcessGroup


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``engines`` (real vLLM replicas, ``make test-engines``) run only when
    the marker expression asks for them: a plain ``pytest`` (``make test``) or one
    filtered on something else never starts a real engine."""
    if "engines" in (config.option.markexpr or ""):
        return
    engines = [item for item in items if item.get_closest_marker("engines")]
    if engines:
        config.hook.pytest_deselected(items=engines)
        items[:] = [item for item in items if not item.get_closest_marker("engines")]


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


@pytest.fixture
def demo_fleet(db: None) -> None:
    """The demo's topology with every replica ready (console pages and operator
    commands act on it)."""
    seed_demo_fleet(ready="all")


@pytest.fixture(scope="session", autouse=True)
def _release_test_database(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """On PostgreSQL, end sessions still open on the test database before pytest-django
    drops it (DROP DATABASE refuses while anyone is connected).  Worker threads of this
    process (asgiref's executors under async tests and consumers) keep a persistent
    connection each (CONN_MAX_AGE); a child process that outlived its test would too,
    so each session is reported with the process that holds it."""
    yield
    with django_db_blocker.unblock():
        from django.db import connection

        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, client_port, state, left(query, 120) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            for backend, port, state, query in cursor.fetchall():
                owner = _process_on_port(port)
                sys.stderr.write(
                    f"\nending a leftover session on the test database ({state}, last query "
                    f"{query!r}) held by: {owner}\n"
                )
                cursor.execute("SELECT pg_terminate_backend(%s)", [backend])


def _process_on_port(port: int | None) -> str:
    import psutil

    for conn in psutil.net_connections(kind="tcp"):
        if port and conn.laddr and conn.laddr.port == port and conn.pid:
            return " ".join(psutil.Process(conn.pid).cmdline())[:300]
    return "an unknown process"
