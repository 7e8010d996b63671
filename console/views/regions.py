"""Regions & balancers: create and edit regions, zones, balancers and RTTs, and see
which balancer owns which replicas now (after a failover, SkyLB §4.2)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.forms import BaseForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.forms import BalancerForm, LatencyForm, RegionForm, ZoneForm
from console.views.topology import topology_document
from fleet.models import Balancer, Region, RegionLatency, Zone

FORMS: dict[str, Any] = {
    "region": RegionForm,
    "zone": ZoneForm,
    "balancer": BalancerForm,
    "latency": LatencyForm,
}
MODELS: dict[str, Any] = {"region": Region, "balancer": Balancer}


def _context(bound: dict[str, BaseForm] | None = None) -> dict[str, Any]:
    forms = {kind: cls() for kind, cls in FORMS.items()}
    forms.update(bound or {})
    return {
        "forms": forms,
        "regions": Region.objects.prefetch_related("zones", "balancers"),
        "zones": Zone.objects.select_related("region"),
        "latencies": RegionLatency.objects.select_related("source", "target"),
        "topology": topology_document(),
    }


@staff_member_required
def regions(request: HttpRequest) -> HttpResponse:
    return render(request, "console/regions.html", _context())


@staff_member_required
@require_POST
def create(request: HttpRequest, kind: str) -> HttpResponse:
    form = FORMS[kind](request.POST) if kind in FORMS else None
    if form is None:
        return HttpResponse(status=404)
    if not form.is_valid():
        return render(request, "console/regions.html", _context({kind: form}), status=400)
    saved = form.save()
    messages.success(request, f"{kind} {saved} saved")
    return redirect("console-regions")


@staff_member_required
def edit(request: HttpRequest, kind: str, name: str) -> HttpResponse:
    if kind not in MODELS:
        return HttpResponse(status=404)
    instance = get_object_or_404(MODELS[kind], name=name)
    form = FORMS[kind](request.POST or None, instance=instance)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, f"{kind} {instance} saved")
        return redirect("console-regions")
    return render(request, "console/edit.html", {"form": form, "kind": kind, "obj": instance})
