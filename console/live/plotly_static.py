"""Serve the plotly package's own bundled ``plotly.min.js`` as a static file.

The console must work on a closed network, so plotly.js comes from the installed
Python package (the very version the pinned ``plotly`` ships), never a CDN.  A
staticfiles finder makes it visible to ``runserver``/daphne's static handler and to
``collectstatic`` without copying a 4 MB file into the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PUBLIC_PATH = "console/vendor/plotly.min.js"
SOURCE = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


class PlotlyFinder(BaseFinder):
    def check(self, **kwargs: Any) -> list[Any]:
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> Any:
        if path != PUBLIC_PATH:
            return [] if find_all else None
        return [str(SOURCE)] if find_all else str(SOURCE)

    def list(self, ignore_patterns: Any) -> Any:
        storage = FileSystemStorage(location=str(SOURCE.parent))
        storage.prefix = str(Path(PUBLIC_PATH).parent)  # type: ignore[attr-defined]
        yield SOURCE.name, storage
