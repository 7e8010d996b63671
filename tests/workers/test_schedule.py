"""Beat entries: every control-plane task is scheduled, and expires before it runs again."""

from __future__ import annotations

from typing import Any

import pytest

from meridian.celery import app
from workers.schedule import beat_schedule


def test_every_entry_expires_before_its_next_run() -> None:
    schedule = beat_schedule()
    assert set(schedule) == {
        "probe-replicas",
        "probe-balancers",
        "sync-balancers",
        "failover-balancers",
        "rollup-metrics",
        "prune-rollups",
        "sync-cache-state",
        "live-snapshot",
        "scale-services",
    }
    for entry in schedule.values():
        assert entry["options"]["expires"] < entry["schedule"]
        app.loader.import_default_modules()
        assert entry["task"] in app.tasks


def test_periods_come_from_settings(settings: Any) -> None:
    settings.MERIDIAN_ROLLUP_PERIOD_S = 3.0
    settings.MERIDIAN_FAILOVER_PERIOD_S = 0.5
    schedule = beat_schedule()
    assert schedule["rollup-metrics"]["schedule"] == 3.0
    assert schedule["failover-balancers"]["options"]["expires"] == pytest.approx(0.4)
