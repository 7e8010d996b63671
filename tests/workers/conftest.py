"""Fixtures for control-plane tests: topology rows and a scripted HTTP server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.http_server import FakeServer
from tests.support.rows import Rows


@pytest.fixture
def rows(db: None) -> Rows:
    return Rows()


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    server = FakeServer()
    yield server
    server.close()
