"""Simulations page: the last reports of ``manage.py simulate`` side by side, each
linking to its plotly HTML (listed by ``sim.des.saved_reports``).  A report loads
``plotly.min.js`` from beside itself, so that name is served here too, from the
plotly package's own bundle (as the console's static finder serves it)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from sim.des.saved_reports import PLOTLY_JS, list_reports, reports_dir

REPORT_LIMIT = 20


@staff_member_required
def simulations(request: HttpRequest) -> HttpResponse:
    reports = list_reports(Path(settings.VAR_DIR), limit=REPORT_LIMIT)
    return render(request, "console/simulations.html", {"reports": reports})


@staff_member_required
def simulation_report(request: HttpRequest, name: str) -> FileResponse:
    if name == PLOTLY_JS:
        from console.live.plotly_static import SOURCE  # plotly only when a report asks

        return FileResponse(SOURCE.open("rb"), content_type="text/javascript; charset=utf-8")
    # Only a bare file name that list_reports would show: never a path out of the folder.
    folder = reports_dir(Path(settings.VAR_DIR)).resolve()
    page = (folder / name).resolve()
    if page.parent != folder or page.suffix != ".html" or not page.is_file():
        raise Http404("no such simulation report")
    return FileResponse(page.open("rb"), content_type="text/html; charset=utf-8")
