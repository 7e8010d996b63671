"""Refuse oversized API bodies before Django spools them.

Django's ASGI handler copies the whole request body into a spooled temporary
file before a view runs.  This ASGI middleware answers 413 with an OpenAI-style
body before that: at once from ``Content-Length``, or, for chunked uploads that
declare none, as soon as the running total passes the limit.  Bodies within the
limit are handed on untouched (the view checks again).

Under daphne the server itself has already received the body (Twisted collects
it, spilling to a temporary file, before dispatching), so the hard stop for
hostile uploads belongs in the front proxy (``client_max_body_size`` and the
like); this layer keeps the application from doing the same work twice and
gives ASGI servers that stream bodies (uvicorn, hypercorn) an early refusal.
"""

from __future__ import annotations

import json

from core import errors
from routing.asgi_types import ASGIApp, Message, Receive, Scope, Send

LIMITED_PREFIX = "/v1/"


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(LIMITED_PREFIX):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await _refuse(send, declared, self.limit)
            return
        if declared is not None:
            await self.app(scope, receive, send)
            return
        buffered = await _read_up_to(receive, self.limit)
        if buffered is None:
            await _refuse(send, None, self.limit)
            return
        await self.app(scope, _replay(buffered, receive), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the view answers 400 for a non-numeric header
    return None


async def _read_up_to(receive: Receive, limit: int) -> list[Message] | None:
    """The body messages of a request without Content-Length, or None past ``limit``."""
    messages, total = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages  # a disconnect: let the app see it
        total += len(message.get("body", b""))
        if total > limit:
            return None
        if not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


async def _refuse(send: Send, size: int | None, limit: int) -> None:
    error = errors.request_too_large(size, limit)
    body = json.dumps(error.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
