"""Typed readers for environment variables: bad values stop start-up with a clear message."""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: expected true/false (1/0, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: must be at least {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_map(name: str) -> dict[str, str]:
    """``key=value,key=value`` as a dict; a pair without ``=`` or a repeated key stops start-up."""
    out: dict[str, str] = {}
    for item in env_list(name, []):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ImproperlyConfigured(f"{name}: {item!r} is not key=value")
        if key in out:
            raise ImproperlyConfigured(f"{name}: {key!r} is given twice")
        out[key] = value
    return out


# Every SQLite database, the default file or one named by DATABASE_URL: several
# processes (balancers, worker, console) share it.  WAL lets readers proceed during a
# write; IMMEDIATE takes the write lock when a transaction begins, so one that read
# first never fails to upgrade (in WAL, a deferred transaction whose snapshot another
# writer moved on fails with "database is locked" at once, whatever the timeout);
# the timeout is how long a writer waits for another's lock.
SQLITE_OPTIONS: dict[str, object] = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
}

# Keep a process's connection open between uses: opening one (and its PRAGMAs) cost
# more than the balancer's whole idle topology check it served.
SQLITE_CONN_MAX_AGE = 60

_ENGINES = {
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "pgsql": "django.db.backends.postgresql",
    "sqlite": "django.db.backends.sqlite3",
}


def parse_database_url(url: str) -> dict[str, object]:
    """A Django DATABASES entry from ``postgres://user:pw@host:port/name`` or ``sqlite:///path``."""
    parts = urlsplit(url)
    engine = _ENGINES.get(parts.scheme)
    if engine is None:
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {parts.scheme!r} is not supported (use postgres:// or sqlite:///)"
        )
    if engine.endswith("sqlite3"):
        path = unquote(parts.path)
        # sqlite:////abs/path gives //abs/path; sqlite:///rel gives /rel (relative intended).
        name = path[1:] if path.startswith("//") else path.lstrip("/") or ":memory:"
        return {
            "ENGINE": engine,
            "NAME": name,
            "OPTIONS": dict(SQLITE_OPTIONS),
            "CONN_MAX_AGE": SQLITE_CONN_MAX_AGE,
        }
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL names no database (postgres://host:5432/NAME)")
    return {
        "ENGINE": engine,
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": dict(parse_qsl(parts.query)),
        "CONN_MAX_AGE": 60,
    }
