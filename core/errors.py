"""OpenAI-style API errors: one exception type, one body shape.

Clients (the official SDKs, LangChain, curl scripts) branch on the HTTP status and
read ``error.message``/``error.code``, so every refusal the balancer makes, from a
bad API key to "every replica is busy", carries exactly OpenAI's envelope::

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

The constructors below fix the status/type/code pairs so the views never invent
new spellings.  Types follow what api.openai.com returns (``invalid_request_error``
for 4xx caused by the request, ``server_error`` for 5xx); 429/503 also carry
``Retry-After`` because the SDKs honour it when they retry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"

# Codes the balancer counts separately (``meridian_queue_rejected_total``).
QUEUE_FULL = "queue_full"


@dataclass(eq=False)
class ApiError(Exception):
    """A refusal that becomes an OpenAI-style JSON error response."""

    status: int
    message: str
    type: str = INVALID_REQUEST
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid_json(detail: str) -> ApiError:
    return ApiError(
        400,
        f"We could not parse the JSON body of your request ({detail}). The body must be "
        "a JSON object.",
        code="invalid_json",
    )


def missing_parameter(param: str) -> ApiError:
    return ApiError(
        400,
        f"Missing required parameter: '{param}'.",
        param=param,
        code="missing_required_parameter",
    )


def invalid_type(param: str, expected: str, value: object) -> ApiError:
    got = _json_type_name(value)
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def invalid_api_key(provided: bool) -> ApiError:
    message = (
        "Incorrect API key provided. You can find your API keys in the Meridian console."
        if provided
        else "You didn't provide an API key. You need to provide your API key in an "
        "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
    )
    return ApiError(401, message, code="invalid_api_key")


def too_many_auth_failures(retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        "Too many requests with an invalid API key from your address; retry later with a "
        "valid key.",
        type=RATE_LIMIT,
        code="too_many_auth_failures",
        headers={"Retry-After": str(retry_after_s)},
    )


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def request_too_large(size: int | None, limit: int) -> ApiError:
    shown = f"{size} bytes" if size is not None else "too large"
    return ApiError(
        413,
        f"Request body is {shown}; this balancer accepts at most {limit} bytes.",
        code="request_too_large",
    )


def unknown_url(method: str, path: str) -> ApiError:
    """A path no route serves: api.openai.com's wording, as JSON (never an HTML page)."""
    return ApiError(404, f"Invalid URL ({method} {path})", code="unknown_url")


def method_not_allowed(method: str, allowed: str) -> ApiError:
    return ApiError(
        405,
        f"Method {method} is not allowed on this endpoint; use {allowed}.",
        code="method_not_allowed",
        headers={"Allow": allowed},
    )


def internal_error() -> ApiError:
    """A bug on the balancer's side: the client learns no detail, the log has it all."""
    return ApiError(
        500,
        "The balancer failed to handle your request; it has been logged. Retry, and report "
        "it to the operator if it persists.",
        type=SERVER_ERROR,
        code="internal_error",
    )


def request_refused_by_server(status: int) -> ApiError:
    """Django refused the request before any view ran (an undecodable path or header)."""
    return ApiError(status, "The request could not be read.", code="invalid_request")


def not_a_balancer() -> ApiError:
    return ApiError(
        503,
        "This Meridian process is the console, not a balancer: send inference requests to "
        "a regional balancer's URL (MERIDIAN_BALANCER names the balancer a process plays).",
        type=SERVER_ERROR,
        code="not_a_balancer",
    )


def balancer_unavailable(detail: str, retry_after_s: int) -> ApiError:
    return ApiError(
        503,
        f"The balancer cannot route requests right now: {detail}",
        type=SERVER_ERROR,
        code="balancer_unavailable",
        headers={"Retry-After": str(retry_after_s)},
    )


def no_healthy_replica(model: str, retry_after_s: int) -> ApiError:
    return ApiError(
        503,
        f"No healthy replica can serve model `{model}` in this region or any reachable "
        "peer region. Please retry shortly.",
        type=SERVER_ERROR,
        code="no_healthy_replica",
        headers={"Retry-After": str(retry_after_s)},
    )


def at_capacity(model: str, retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        f"Every replica serving model `{model}` is at capacity. Please retry after "
        f"{retry_after_s} s.",
        type=RATE_LIMIT,
        code="capacity_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )


def queue_full(model: str, max_len: int, retry_after_s: int) -> ApiError:
    """The regional queue (SkyLB §3.3) holds ``max_len`` requests already."""
    return ApiError(
        429,
        f"Every replica serving model `{model}` is busy and {max_len} requests are "
        f"already waiting for one. Please retry after {retry_after_s} s.",
        type=RATE_LIMIT,
        code=QUEUE_FULL,
        headers={"Retry-After": str(retry_after_s)},
    )


def queue_timeout(model: str, waited_s: float, retry_after_s: int) -> ApiError:
    """A queued request reached its ``queue_max_wait_s`` without a free target."""
    return ApiError(
        503,
        f"The request for model `{model}` waited {waited_s:.1f} s in the balancer's "
        "queue and no replica became free. Please retry shortly.",
        type=SERVER_ERROR,
        code="queue_timeout",
        headers={"Retry-After": str(retry_after_s)},
    )


def upstream_failed(model: str, attempts: int, last_reason: str) -> ApiError:
    return ApiError(
        502,
        f"The request for model `{model}` failed on {attempts} replica(s) before any "
        f"output was produced (last error: {last_reason}).",
        type=SERVER_ERROR,
        code="upstream_error",
    )


def upstream_error_body(status: int, body: bytes, *, path: str, model: str) -> bytes | None:
    """A replica's error answer in OpenAI's envelope; None when it already is one.

    vLLM's own errors are OpenAI-shaped, but a route its model does not serve
    (``/v1/embeddings`` on a generative model, chat on an embedding model) ends
    in FastAPI's ``{"detail": "Not Found"}``, and a proxy in front of it may send
    text or HTML: clients get the same envelope as every other error, with the
    replica's own words as the message.
    """
    detail = _upstream_detail(body)
    if detail is None:
        return None
    if status == 404:
        message = f"The replicas of model `{model}` do not serve {path} (they answered: {detail})."
    else:
        message = f"The replica answered {status}: {detail}"
    kind = SERVER_ERROR if status >= 500 else INVALID_REQUEST
    error = ApiError(status, message, type=kind, code="upstream_error" if status >= 500 else None)
    return json.dumps(error.body()).encode()


def _upstream_detail(body: bytes) -> str | None:
    """What a non-OpenAI error body says; None for an OpenAI-shaped one."""
    try:
        parsed = json.loads(body)
    except ValueError:
        text = body.decode(errors="replace").strip()
        return text[:300] or "no body"
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return None
    if isinstance(parsed, dict) and "detail" in parsed:
        return str(parsed["detail"])[:300]
    return json.dumps(parsed)[:300]


def _json_type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
