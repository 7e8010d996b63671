"""Events page: the history, filterable by kind, severity and subject; new Events
arrive over the WebSocket and are filtered the same way in the browser."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.models import Event

PAGE = 200


@staff_member_required
def events(request: HttpRequest) -> HttpResponse:
    kind = request.GET.get("kind", "")
    severity = request.GET.get("severity", "")
    subject = request.GET.get("subject", "")
    rows = Event.objects.all()
    if kind:
        rows = rows.filter(kind=kind)
    if severity:
        rows = rows.filter(severity=severity)
    if subject:
        rows = rows.filter(subject__icontains=subject)
    context = {
        "events": rows[:PAGE],
        "kinds": Event.objects.order_by("kind").values_list("kind", flat=True).distinct(),
        "severities": Event.Severity.values,
        "filters": {"kind": kind, "severity": severity, "subject": subject},
    }
    return render(request, "console/events.html", context)
