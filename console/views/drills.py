"""Drills page: one button per drill command (``drill_catalog``), the live timeline of
the drill running now, and past ``DrillRun``s with their outcome."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.management.base import CommandError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.views.drill_catalog import drill_argv, drill_specs, start_drill
from fleet.models import DrillRun


@staff_member_required
def drills(request: HttpRequest) -> HttpResponse:
    context = {"specs": drill_specs(), "runs": DrillRun.objects.all()[:30]}
    return render(request, "console/drills.html", context)


@staff_member_required
@require_POST
def run(request: HttpRequest, name: str) -> HttpResponse:
    values = {
        key.removeprefix("opt_"): request.POST.get(key, "")
        for key in request.POST
        if key.startswith("opt_")
    }
    try:
        run_id = start_drill(name, drill_argv(name, request.POST.get("target", ""), values))
    except CommandError as exc:
        messages.error(request, f"{name}: {exc}")
    else:
        messages.info(request, f"{name} started (run {run_id}); its timeline follows live.")
    return redirect("console-drills")
