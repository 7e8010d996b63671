"""The inference routes of the ``/v1/`` API on plain ASGI: no Django on the hot path.

``PlainApi`` serves ``POST`` to every ``Endpoint`` path itself: headers from the
scope, the body read under the API's limit, the view's own work
(``routing.views.completions.handle``: plain values in, a ``ProxyResponse`` out) and
the answer sent as ``http.response.start`` and ``http.response.body`` messages.  A
relayed stream is written straight to the client's connection when the server offers
that (``routing.asgi_types.DIRECT_BODY``, the balancer's uvicorn protocol), one write
per upstream read from the upstream connection's callbacks; elsewhere it is one
message per relayed chunk.  No ``HttpRequest``, URL resolution or Django
response stands between the client and the relay; the profile of ``manage.py bench
proxy`` showed them as a large part of a proxied request's CPU time
(docs/performance.md).  Every other path (the catalogue, unknown ``/v1`` paths, and
whatever is not ``/v1``) goes on to ``fallback``.

The answers are those of the Django view: the same statuses, headers and
OpenAI-shaped errors, counted the same way.  An exception no view turned into an
``ApiError`` becomes a 500 ``internal_error`` (logged, counted in
``meridian_internal_errors_total`` and ``meridian_requests_total``).  A client that
leaves cancels the work in hand: the dispatcher gives its lease back, the view
finishes the key's hold, and a stream being relayed ends and settles as closed by
the client (its upstream closed with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

from core import errors
from core.openai_request import Endpoint
from routing.asgi_types import DIRECT_BODY, ASGIApp, BodyWriter, Receive, Scope, Send
from routing.calls import ROUTE_FORWARDED_IN, ROUTE_LOCAL, ApiRequest, Headers, ProxyResponse
from routing.errors import error_description
from routing.internal_auth import forwarded_with
from routing.process import current_runtime
from routing.upstream import RelayStream
from routing.views.completions import UNKNOWN_MODEL_LABEL, handle

logger = logging.getLogger(__name__)

ENDPOINTS = {endpoint.path: endpoint for endpoint in Endpoint}


class PlainApi:
    """ASGI app serving the ``Endpoint`` paths; everything else goes to ``fallback``.

    ``max_body``: the most body bytes read; a longer body is answered 413 unread
    (``routing.body_limit`` in front refuses most of them before they arrive).
    """

    def __init__(self, fallback: ASGIApp, max_body: int) -> None:
        if max_body < 1:
            raise ValueError(f"max_body must be at least 1 byte, not {max_body}")
        self.fallback = fallback
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = ENDPOINTS.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            await self.fallback(scope, receive, send)
            return
        read = await _read_body(receive, self.max_body)
        if read is _GONE:
            return  # the client left before its body was in
        client = scope.get("client")
        request = ApiRequest(
            scope["method"],
            scope["path"],
            Headers.from_asgi(scope.get("headers", [])),
            str(client[0]) if client else None,
            read if isinstance(read, bytes) else None,
        )
        extensions = scope.get("extensions")
        direct = extensions.get(DIRECT_BODY) if extensions else None
        await _respond(request, endpoint, receive, send, direct)


_GONE = object()
_TOO_LARGE = object()


async def _read_body(receive: Receive, limit: int) -> bytes | object:
    """The body; ``_TOO_LARGE`` past ``limit`` bytes, ``_GONE`` if the client left."""
    parts: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _GONE
        if message["type"] != "http.request":
            continue
        part: bytes = message.get("body", b"")
        total += len(part)
        if total > limit:
            return _TOO_LARGE
        if part:
            parts.append(part)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _respond(
    request: ApiRequest,
    endpoint: Endpoint,
    receive: Receive,
    send: Send,
    direct: BodyWriter | None = None,
) -> None:
    """Answer and send, cancelling both if the client leaves first.

    The work runs in the server's own task; one listener task waits for the client to
    leave and cancels it.  (A second task for the work and an ``asyncio.wait`` on the
    two cost a task, a future and their callbacks per request, for the same outcome.)"""
    task = asyncio.current_task()
    assert task is not None, "an ASGI application runs in a task"
    state = _Listening(task)
    listener = asyncio.create_task(_disconnected(receive))
    listener.add_done_callback(state.heard)
    try:
        response = await _answer(request, endpoint)
        await _send(response, send, direct)
    except asyncio.CancelledError:
        # Ours (the client left): swallowed, as the task that ran the work used to be;
        # another cancellation as well (the server's) goes on.
        if not state.left or task.uncancel() > 0:
            raise
    finally:
        state.working = False
        if not listener.done():
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
    if state.left:
        listener.result()  # re-raises a receive failure, as Django's handler does


class _Listening:
    """Whether the client left while the work was in hand (and then cancels it)."""

    __slots__ = ("left", "task", "working")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.working = True
        self.left = False

    def heard(self, listener: asyncio.Task[None]) -> None:
        # Runs from the loop, never inside the work's step: a ``working`` work is
        # suspended at one of its awaits, where the cancellation lands.
        if self.working and not listener.cancelled():
            self.left = True
            self.task.cancel()


async def _disconnected(receive: Receive) -> None:
    """Returns when the client leaves (a body still arriving is read and dropped)."""
    message = await receive()
    while message["type"] != "http.disconnect":
        message = await receive()


async def _answer(request: ApiRequest, endpoint: Endpoint) -> ProxyResponse:
    try:
        return await handle(request, endpoint)
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        _count_internal_error(request)
        return error_description(errors.internal_error())


def _count_internal_error(request: ApiRequest) -> None:
    runtime = current_runtime()
    if runtime is None:
        return
    forwarded = forwarded_with(request.headers, runtime.config.internal_token)
    runtime.metrics.internal_errors.inc()
    runtime.metrics.requests.inc(
        UNKNOWN_MODEL_LABEL, "500", ROUTE_FORWARDED_IN if forwarded else ROUTE_LOCAL
    )


async def _send(response: ProxyResponse, send: Send, direct: BodyWriter | None = None) -> None:
    headers = [(b"content-type", response.content_type.encode("latin-1"))]
    headers += [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
    ]
    stream = response.stream
    if stream is None:
        headers.append((b"content-length", str(len(response.body)).encode()))
        start = {"type": "http.response.start", "status": response.status, "headers": headers}
        body = {"type": "http.response.body", "body": response.body}
        if direct is not None:
            await direct.whole(send, start, body)  # head and body in one write
        else:
            await send(start)
            await send(body)
        return
    chunks = aiter(stream)
    start = {"type": "http.response.start", "status": response.status, "headers": headers}
    try:
        if isinstance(stream, RelayStream) and direct is not None:
            await direct.start(send, start)
            if direct.usable():
                await stream.relay_to(direct)  # which ends the response as well
                return
            direct.release()  # not a chunked body after all: the head goes out now
        else:
            await send(start)
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        # Also when cancelled (the client left) or a send failed: the relay's own end
        # settles its request; one never started is settled by its ``aclose``.
        if isinstance(chunks, AsyncGenerator):
            await chunks.aclose()
        if isinstance(stream, RelayStream):
            await stream.aclose()
