"""Saved simulation reports on disk: where they go and how the console lists them.

Each report is an HTML page under ``<VAR_DIR>/simulations/`` with a JSON sidecar
holding the run's title, options and summaries, so listing reports reads small JSON
files and never parses HTML.  This module knows that layout and nothing about
rendering, so the console's pages list reports without importing plotly (the page
itself is rendered by ``sim.des.report``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPORTS_SUBDIR = "simulations"
# Reports load plotly.js from this file beside them (``sim.des.report``), and the
# console serves the plotly package's copy under the same name beside the reports.
PLOTLY_JS = "plotly.min.js"


def reports_dir(var_dir: Path) -> Path:
    return Path(var_dir) / REPORTS_SUBDIR


def new_report_path(var_dir: Path, title: str) -> Path:
    """A fresh name under the reports dir: a UTC timestamp, then the title as a slug."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60]
    return reports_dir(var_dir) / f"{stamp}-{slug}.html"


def write_report(
    path: Path,
    page: str,
    title: str,
    options: dict[str, Any],
    summaries: list[dict[str, Any]],
) -> Path:
    """Write the page, then its sidecar: a listed report always has its page."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    sidecar = {
        "title": title,
        "created": datetime.now(UTC).isoformat(),
        "options": options,
        "summaries": summaries,
    }
    path.with_suffix(".json").write_text(json.dumps(sidecar, default=str), encoding="utf-8")
    return path


@dataclass(frozen=True)
class ReportInfo:
    """A saved report as the console lists it."""

    path: Path
    title: str
    created: str
    options: dict[str, Any]
    summaries: list[dict[str, Any]]


def list_reports(var_dir: Path, limit: int = 20) -> list[ReportInfo]:
    """Saved reports under ``<var_dir>/simulations/``, newest first.

    Console pages call ``list_reports(settings.VAR_DIR)``; a sidecar that cannot
    be read is skipped (a report being written right now).
    """
    found = []
    for sidecar in reports_dir(var_dir).glob("*.json"):
        page = sidecar.with_suffix(".html")
        try:
            data = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not page.is_file() or not isinstance(data, dict):
            continue
        found.append(
            ReportInfo(
                page,
                str(data.get("title", page.stem)),
                str(data.get("created", "")),
                dict(data.get("options") or {}),
                list(data.get("summaries") or []),
            )
        )
    found.sort(key=lambda info: (info.created, info.path.name), reverse=True)
    return found[:limit]
