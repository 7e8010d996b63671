"""A balancer told to stop must stop: each close step is bounded, and a stuck one
is named in the log while the steps after it still run."""

from __future__ import annotations

import asyncio
import logging

import pytest

from routing.runtime import close_in_order


def test_a_stuck_step_is_left_behind_and_the_rest_still_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed: list[str] = []

    async def stuck() -> None:
        await asyncio.Event().wait()  # nothing ever sets it

    async def quick(name: str) -> None:
        closed.append(name)

    async def scenario() -> list[str]:
        return await close_in_order(
            [
                ("first", lambda: quick("first")),
                ("redis", stuck),
                ("last", lambda: quick("last")),
            ],
            timeout_s=0.05,
        )

    with caplog.at_level(logging.WARNING, logger="routing.runtime"):
        assert asyncio.run(scenario()) == ["redis"]
    assert closed == ["first", "last"]
    assert "redis did not close within" in caplog.text


def test_steps_that_finish_report_nothing_stuck() -> None:
    async def scenario() -> list[str]:
        return await close_in_order([("one", lambda: asyncio.sleep(0))], timeout_s=1.0)

    assert asyncio.run(scenario()) == []
