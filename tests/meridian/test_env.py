from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from meridian.env import (
    SQLITE_CONN_MAX_AGE,
    SQLITE_OPTIONS,
    env_bool,
    env_float,
    env_int,
    parse_database_url,
)


def test_postgres_url_becomes_a_django_database_entry() -> None:
    db = parse_database_url("postgres://meridian:s%40cret@127.0.0.1:5432/meridian?sslmode=disable")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["USER"], db["PASSWORD"]) == ("meridian", "meridian", "s@cret")
    assert (db["HOST"], db["PORT"]) == ("127.0.0.1", "5432")
    assert db["OPTIONS"] == {"sslmode": "disable"}


def test_sqlite_urls_keep_absolute_and_relative_paths() -> None:
    assert parse_database_url("sqlite:////tmp/x.sqlite3")["NAME"] == "/tmp/x.sqlite3"
    assert parse_database_url("sqlite:///var/x.sqlite3")["NAME"] == "var/x.sqlite3"


def test_a_sqlite_url_gets_the_options_of_the_default_database() -> None:
    # Processes pointed at a file by DATABASE_URL (the test suite's children among
    # them) share it as the default file's do: WAL, IMMEDIATE writes, a lock timeout.
    database = parse_database_url("sqlite:////tmp/x.sqlite3")
    assert database["OPTIONS"] == SQLITE_OPTIONS
    assert SQLITE_OPTIONS["transaction_mode"] == "IMMEDIATE"
    # ... and keep their connection open between uses, as the default file does.
    assert database["CONN_MAX_AGE"] == SQLITE_CONN_MAX_AGE


@pytest.mark.parametrize("url", ["mysql://h/db", "postgres://127.0.0.1:5432/"])
def test_unsupported_or_incomplete_database_urls_are_refused(url: str) -> None:
    with pytest.raises(ImproperlyConfigured):
        parse_database_url(url)


def test_typed_readers_refuse_bad_values_with_the_variable_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("X_BOOL", "maybe")
    monkeypatch.setenv("X_INT", "12abc")
    monkeypatch.setenv("X_FLOAT", "-1")
    with pytest.raises(ImproperlyConfigured, match="X_BOOL"):
        env_bool("X_BOOL", False)
    with pytest.raises(ImproperlyConfigured, match="X_INT"):
        env_int("X_INT", 1)
    with pytest.raises(ImproperlyConfigured, match="at least 0"):
        env_float("X_FLOAT", 1.0, minimum=0.0)


def test_typed_readers_fall_back_to_defaults_and_parse_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("X_UNSET", raising=False)
    monkeypatch.setenv("X_ON", "Yes")
    monkeypatch.setenv("X_NUM", "42")
    assert env_bool("X_UNSET", True) is True
    assert env_bool("X_ON", False) is True
    assert env_int("X_NUM", 1, minimum=1) == 42


@pytest.mark.django_db
def test_suite_runs_on_the_database_that_database_url_names() -> None:
    import os

    from django.db import connection

    from fleet.models import Region

    url = os.environ.get("DATABASE_URL", "")
    assert connection.vendor == ("postgresql" if url.startswith("postgres") else "sqlite")
    Region.objects.create(name="round-trip")
    assert Region.objects.filter(name="round-trip").exists()
