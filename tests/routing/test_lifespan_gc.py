"""The balancer's collector thresholds, set once its runtime has started."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from routing import lifespan


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_young_threshold_changes_only_the_young_generation(restored_gc: None) -> None:
    gc.set_threshold(700, 10, 10)
    lifespan.young_gc_threshold(20_000)
    assert gc.get_threshold() == (20_000, 10, 10)


def test_started_runtime_freezes_and_applies_the_setting(
    restored_gc: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.MERIDIAN_BALANCER = True
    settings.MERIDIAN_BALANCER_GC_GEN0 = 4321
    started: list[bool] = []

    async def fake_runtime() -> None:
        started.append(True)

    monkeypatch.setattr(lifespan, "get_runtime", fake_runtime)
    gc.set_threshold(700, 10, 10)
    asyncio.run(lifespan.start_runtime())
    assert started == [True]
    assert gc.get_threshold() == (4321, 10, 10)
    assert gc.get_freeze_count() > 0


def test_no_balancer_leaves_the_collector_alone(
    restored_gc: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.MERIDIAN_BALANCER = False
    settings.MERIDIAN_BALANCER_GC_GEN0 = 4321
    gc.set_threshold(700, 10, 10)
    asyncio.run(lifespan.start_runtime())
    assert gc.get_threshold() == (700, 10, 10)
