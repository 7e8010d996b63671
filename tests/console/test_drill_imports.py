"""The drills page lists every drill command with its form, built from the command's
own parser, without the openai SDK: that loads only when a drill sends traffic."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.django_env import child_process_env
from tests.support.imports import modules_imported_by


@pytest.mark.django_db
def test_the_drill_forms_are_built_without_the_openai_sdk(settings: Any) -> None:
    loaded = modules_imported_by(
        "from console.views.drill_catalog import drill_specs\n"
        "assert {s.name for s in drill_specs()} >= {'drill_preempt', 'drill_partition'}",
        child_process_env(settings.REDIS_URL),
    )
    assert "ops.drills.cli" in loaded
    assert "openai" not in loaded
