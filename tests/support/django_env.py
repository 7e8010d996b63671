"""Environment for child processes that must see this test session's database."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings


def child_process_env(redis_url: str) -> dict[str, str]:
    """Settings for a child (balancer, worker, command) pointing at the very test
    database and Redis this session uses.  Rows must be committed to be visible."""
    from django.db import connection

    db = connection.settings_dict
    env = {
        "DJANGO_SETTINGS_MODULE": "meridian.settings",
        "MERIDIAN_VAR_DIR": str(settings.VAR_DIR),
        "REDIS_URL": redis_url,
        # Balancer names repeat across tests and runs on one Redis: a test that wants
        # siblings sharing state (tests/routing/test_scale_out_integration.py) says so.
        "MERIDIAN_SHARED_STATE": "0",
    }
    if db["ENGINE"].endswith("sqlite3"):
        env["DATABASE_URL"] = f"sqlite:///{Path(db['NAME']).resolve()}"
        return env
    user, password = db.get("USER") or "", db.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or "5432"
    env["DATABASE_URL"] = f"postgres://{auth}{host}:{port}/{db['NAME']}"
    return env
