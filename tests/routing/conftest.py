"""Fixtures for the balancer's tests: an asyncio backend for in-process async tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    # The balancer runs on asyncio (daphne's Twisted asyncio reactor); test on it only.
    return "asyncio"
