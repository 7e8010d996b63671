"""Turn ``routing.core.errors.ApiError`` into the HTTP response a client sees."""

from __future__ import annotations

from django.http import JsonResponse

from routing.core.errors import ApiError


def error_response(error: ApiError, *, request_id: str | None = None) -> JsonResponse:
    response = JsonResponse(error.body(), status=error.status)
    for name, value in error.headers.items():
        response[name] = value
    if request_id:
        response["X-Request-ID"] = request_id
    return response
