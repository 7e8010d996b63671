"""Service settings: each model's routing policy and parameters (validated as the
balancers will build them, ``workers.policy_config``) and its autoscaling knobs.
Balancers pick changes up at their next topology refresh; every change is an Event."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.forms import BaseForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.forms import AutoscalingForm, PolicyForm
from core.registry import policy_defaults, policy_names
from fleet.models import Event, ServiceConfig
from workers.policy_config import PolicyConfigError, set_policy


def _context(bound: dict[str, BaseForm] | None = None) -> dict[str, Any]:
    services = []
    for config in ServiceConfig.objects.all():
        initial = {
            "model": config.model_name,
            "policy": config.policy,
            "params": json.dumps(config.policy_params),
        }
        services.append(
            {
                "config": config,
                "policy_form": (bound or {}).get(f"policy-{config.pk}")
                or PolicyForm(initial=initial),
                "autoscaling_form": (bound or {}).get(f"autoscaling-{config.pk}")
                or AutoscalingForm(instance=config),
            }
        )
    defaults = {name: policy_defaults(name) for name in policy_names()}
    events = Event.objects.filter(kind__in=["policy_changed", "service_settings_changed"])[:20]
    return {"services": services, "defaults": defaults, "events": events}


@staff_member_required
def service_settings(request: HttpRequest) -> HttpResponse:
    return render(request, "console/service.html", _context())


@staff_member_required
@require_POST
def change_policy(request: HttpRequest, pk: int) -> HttpResponse:
    config = get_object_or_404(ServiceConfig, pk=pk)
    form = PolicyForm(request.POST)
    if form.is_valid():
        try:
            data = form.cleaned_data
            set_policy(
                data["model"].model_name,
                data["policy"],
                data["params"],
                actor=request.user.get_username(),
            )
        except PolicyConfigError as exc:
            form.add_error("params", str(exc))
        else:
            messages.success(request, f"{config}: policy {data['policy']}")
            return redirect("console-service")
    return render(request, "console/service.html", _context({f"policy-{pk}": form}), status=400)


@staff_member_required
@require_POST
def change_autoscaling(request: HttpRequest, pk: int) -> HttpResponse:
    config = get_object_or_404(ServiceConfig, pk=pk)
    before = {f: getattr(config, f) for f in AutoscalingForm.Meta.fields}
    form = AutoscalingForm(request.POST, instance=config)
    if not form.is_valid():
        ctx = _context({f"autoscaling-{pk}": form})
        return render(request, "console/service.html", ctx, status=400)
    form.save(commit=False).save_recording_changes(before, actor=request.user.get_username())
    messages.success(request, f"{config}: autoscaling saved")
    return redirect("console-service")
