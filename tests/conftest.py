"""Fixtures shared by the whole suite: a real Redis and real child processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from console.embedded_redis import EmbeddedRedis, ensure_redis
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
def django_subprocess_env(redis_server: EmbeddedRedis, settings_dict_for_children: dict[str, str]) -> dict[str, str]:
    """Environment for a child process (balancer, worker, command) that must see the very
    database and Redis this test uses.  Pair it with ``django_db(transaction=True)`` so
    what the test writes is committed and visible to the child."""
    return {**settings_dict_for_children, "REDIS_URL": redis_server.url}


@pytest.fixture
def settings_dict_for_children(db: None) -> dict[str, str]:
    from django.db import connection

    db_settings = connection.settings_dict
    env = {"DJANGO_SETTINGS_MODULE": "console.settings", "MERIDIAN_VAR_DIR": str(settings.VAR_DIR)}
    if db_settings["ENGINE"].endswith("sqlite3"):
        env["DATABASE_URL"] = f"sqlite:///{Path(db_settings['NAME']).resolve()}"
    else:
        user = db_settings.get("USER") or ""
        password = db_settings.get("PASSWORD") or ""
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = db_settings.get("HOST") or "127.0.0.1"
        port = db_settings.get("PORT") or "5432"
        env["DATABASE_URL"] = f"postgres://{auth}{host}:{port}/{db_settings['NAME']}"
    return env
