"""Turn ``core.errors.ApiError`` into the HTTP response a client sees, and a
view's ``ProxyResponse`` into Django's response for the views Django serves."""

from __future__ import annotations

import json

from django.http import HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse

from core.errors import ApiError
from routing.calls import ProxyResponse

JSON = "application/json"


def error_response(error: ApiError, *, request_id: str | None = None) -> JsonResponse:
    response = JsonResponse(error.body(), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    if request_id:
        response["X-Request-ID"] = request_id
    return response


def error_description(error: ApiError, *, request_id: str | None = None) -> ProxyResponse:
    """``error_response`` as a ``ProxyResponse``: the same body, status and headers."""
    response = ProxyResponse(error.status, JSON, json.dumps(error.body()).encode())
    for name, value in error.headers.items():
        response[name] = value
    if request_id:
        response["X-Request-ID"] = request_id
    return response


def to_django(response: ProxyResponse) -> HttpResponseBase:
    """The Django response sending what ``response`` describes."""
    django: HttpResponseBase
    if response.stream is not None:
        django = StreamingHttpResponse(
            response.stream, status=response.status, content_type=response.content_type
        )
    else:
        django = HttpResponse(
            response.body, status=response.status, content_type=response.content_type
        )
    for name, value in response.items():
        django[name] = value
    return django
