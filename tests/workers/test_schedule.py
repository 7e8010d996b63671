"""Beat entries: every control-plane task is scheduled, and none has a sub-second deadline."""

from __future__ import annotations

from typing import Any

import pytest

from meridian.celery import app
from workers.schedule import MIN_EXPIRES_S, beat_schedule


def test_every_entry_expires_but_never_within_seconds() -> None:
    schedule = beat_schedule()
    assert set(schedule) == {
        "probe-replicas",
        "probe-balancers",
        "sync-balancers",
        "failover-balancers",
        "rollup-metrics",
        "prune-rollups",
        "rollup-key-usage",
        "forecast-workload",
        "sync-cache-state",
        "scale-services",
    }
    for entry in schedule.values():
        assert entry["options"]["expires"] >= MIN_EXPIRES_S
        app.loader.import_default_modules()
        assert entry["task"] in app.tasks


def test_periods_come_from_settings(settings: Any) -> None:
    settings.MERIDIAN_ROLLUP_PERIOD_S = 3.0
    settings.MERIDIAN_FAILOVER_PERIOD_S = 0.5
    schedule = beat_schedule()
    assert schedule["rollup-metrics"]["schedule"] == 3.0
    # A short period keeps the floor: a busy worker may take seconds to start a task.
    assert schedule["failover-balancers"]["options"]["expires"] == MIN_EXPIRES_S
    settings.MERIDIAN_ROLLUP_PERIOD_S = 60.0
    assert beat_schedule()["rollup-metrics"]["options"]["expires"] == pytest.approx(48.0)
