"""The project package no longer imports the Celery app on every start: the worker and
beat find it themselves, with the project's broker and every scheduled task bound."""

from __future__ import annotations

import json

from django.conf import settings

from tests.support.imports import run_python

# What `celery -A meridian worker --beat` does to find its app and tasks, in a fresh
# process (no test has imported meridian.celery there).
FIND_APP = """
import json
from celery.app.utils import find_app
app = find_app("meridian")
app.loader.import_default_modules()
from workers.tasks import probe_replicas
registered = sorted(app.tasks)  # finalizes the app, which installs the beat schedule
print(json.dumps({
    "main": app.main,
    "broker": app.conf.broker_url,
    "scheduled": sorted(entry["task"] for entry in app.conf.beat_schedule.values()),
    "registered": registered,
    "shared_task_bound": probe_replicas.app is app,
}))
"""


def test_celery_dash_a_meridian_finds_the_project_app_with_every_beat_task() -> None:
    found = json.loads(run_python(FIND_APP, {"REDIS_URL": settings.REDIS_URL}))
    assert found["main"] == "meridian"
    assert found["broker"] == settings.CELERY_BROKER_URL
    assert found["scheduled"] and set(found["scheduled"]) <= set(found["registered"])
    assert found["shared_task_bound"]
