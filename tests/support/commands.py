"""Management commands run in this process, as ``manage.py`` would run them."""

from __future__ import annotations

import io

from django.core.management import call_command


def run_command(*argv: str, **options: object) -> str:
    """Run ``manage.py argv...`` and return what it printed.  Its stderr (progress
    lines, status redraws) is kept out of the test's output."""
    out = io.StringIO()
    call_command(*argv, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()
