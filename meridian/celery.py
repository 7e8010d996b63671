"""The Celery application: configuration from Django settings (CELERY_* names), the
tasks module discovered (``workers.tasks``), the
beat schedule built in ``workers.schedule``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meridian.settings")

app = Celery("meridian")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])


@app.on_after_finalize.connect
def _install_beat_schedule(sender: Celery, **_: object) -> None:
    from workers.schedule import beat_schedule

    sender.conf.beat_schedule = beat_schedule()
