"""Every ``manage.py`` command imports the URLconf for its system checks, so what the
URLconf imports is paid by each of them (an operator's ``drain_replica`` included).
These packages belong to one job each and load only in the process doing it."""

from __future__ import annotations

from tests.support.imports import modules_imported_by

ONLY_WHERE_NEEDED = {
    "openai": "a drill sending traffic (ops.drills.stream), replay",
    "daphne": "the console and daphne balancers, under the daphne command",
    "twisted": "daphne's reactor",
    "celery": "the Celery worker and beat (celery -A meridian)",
    "plotly.graph_objects": "rendering a simulation report",
    "routing.runtime": "a balancer process",
    "httpx": "the runtime, probes and drills when they run",
    "redis": "the runtime, the control plane, a live message being sent",
}


def test_manage_py_check_loads_the_urlconf_but_none_of_the_heavy_packages() -> None:
    loaded = modules_imported_by(
        "from django.core.management import call_command\ncall_command('check')"
    )
    assert {"meridian.urls", "routing.views.completions", "console.views.drills"} <= loaded
    assert sorted(set(ONLY_WHERE_NEEDED) & loaded) == []
