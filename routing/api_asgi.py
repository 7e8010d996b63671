"""The ASGI handler for the OpenAI API paths (``/v1/``).

Requests under ``/v1/`` (the OpenAI API, authenticated by bearer keys, never by the
console's session cookie) go to ``ApiASGIHandler``: Django's own request objects, URL
routing, views and response sending, but none of the thread hops Django's ASGI
handler makes around them.  Under ASGI Django runs every sync piece through
``sync_to_async``: each of the console's middlewares (all sync ``MiddlewareMixin``:
sessions, auth, messages, CSRF, security headers) twice, the ``request_started``
and ``request_finished`` receivers (database connection recycling), and
``response.close``; and the per-request ``ThreadSensitiveContext`` starts a fresh
executor thread and another to shut it down.  The profile of ``manage.py bench
proxy`` showed those hops as the largest single cost of a proxied request
(docs/performance.md).  The API path needs none of it: its views are async and
CSRF-exempt, read no session or user, and never touch the database (the runtime
reads the topology in the background).  Everything else keeps the full stack.

Whatever goes wrong, a ``/v1`` client gets an OpenAI-shaped JSON body: an exception
no view turned into an ``ApiError`` becomes a 500 ``internal_error`` (logged, and
counted in ``meridian_internal_errors_total`` and ``meridian_requests_total``), and a
request Django itself refuses (an undecodable path) gets its status with a JSON body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import HttpRequest, HttpResponseBase
from django.urls import set_script_prefix

from core import errors
from routing.asgi_types import ASGIApp, Receive, Scope, Send
from routing.calls import ROUTE_FORWARDED_IN, ROUTE_LOCAL
from routing.errors import error_response
from routing.internal_auth import forwarded_by_peer
from routing.process import current_runtime

API_PREFIX = "/v1/"
# The model label of a request that failed before its model was known.
UNKNOWN_MODEL_LABEL = "-"

logger = logging.getLogger(__name__)


class ApiASGIHandler(ASGIHandler):
    """Django's ASGI handler for the ``/v1/`` API, without middleware or thread hops.

    Same request parsing, URL resolution, exception-to-response conversion, streaming
    and client-disconnect cancellation as ``ASGIHandler.handle``; left out are the
    middleware chain, the request signals and ``ThreadSensitiveContext``.  The
    responses are JSON or SSE, so the console's HTML security headers do not apply.
    """

    # BaseHandler's private members reused below; django-stubs declares only the public API.
    _get_response: Callable[[HttpRequest], HttpResponseBase]
    _get_response_async: Callable[[HttpRequest], Awaitable[HttpResponseBase]]

    def load_middleware(self, is_async: bool = False) -> None:
        # BaseHandler.load_middleware with settings.MIDDLEWARE taken as empty.
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        # Django's own converter would answer an unexpected exception with an HTML page.
        self._middleware_chain = _json_on_exception(self._get_response_async)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"the API serves HTTP only, not {scope['type']}")
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            set_script_prefix(get_script_prefix(scope))
            match self.create_request(scope, body_file):
                case (None, refused):
                    error = errors.request_refused_by_server(refused.status_code)
                    await self.send_response(error_response(error), send)
                case (request, _):
                    await self._respond(request, receive, send)
        finally:
            body_file.close()

    async def _respond(self, request: HttpRequest, receive: Receive, send: Send) -> None:
        """Run the view and send its response, cancelling both if the client leaves
        (the relay's ``finally`` then closes the upstream, as under Django's handler)."""

        async def process() -> HttpResponseBase:
            response: HttpResponseBase = await self.run_get_response(request)
            with contextlib.suppress(asyncio.CancelledError):  # client left mid-send
                await self.send_response(response, send)
            return response

        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        worker = asyncio.create_task(process())
        await asyncio.wait((listener, worker), return_when=asyncio.FIRST_COMPLETED)
        for task in (listener, worker):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            elif not task.cancelled():
                with contextlib.suppress(RequestAborted):
                    task.result()  # re-raises a view or send failure, as Django does
        if not worker.cancelled():
            _release(worker.result())


def _json_on_exception(
    get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]],
) -> Callable[[HttpRequest], Awaitable[HttpResponseBase]]:
    async def respond(request: HttpRequest) -> HttpResponseBase:
        try:
            return await get_response(request)
        except Exception:
            logger.exception("unhandled error on %s %s", request.method, request.path)
            _count_internal_error(request)
            return error_response(errors.internal_error())

    return respond


def _count_internal_error(request: HttpRequest) -> None:
    runtime = current_runtime()
    if runtime is None:
        return
    forwarded = forwarded_by_peer(request, runtime.config.internal_token)
    runtime.metrics.internal_errors.inc()
    runtime.metrics.requests.inc(
        UNKNOWN_MODEL_LABEL, "500", ROUTE_FORWARDED_IN if forwarded else ROUTE_LOCAL
    )


def _release(response: HttpResponseBase) -> None:
    """``HttpResponseBase.close`` without its ``request_finished`` signal, whose
    receivers recycle database connections the API path never opened."""
    # Private to Django (django-stubs leaves it out): what close() would call.
    closers: list[Callable[[], object]] = response._resource_closers  # type: ignore[attr-defined]
    for closer in closers:
        # Django's close() ignores a failing closer too: the response is already sent.
        with contextlib.suppress(Exception):
            closer()
    closers.clear()
    response.closed = True


def by_path_prefix(prefix: str, matched: ASGIApp, other: ASGIApp) -> ASGIApp:
    """An ASGI app sending requests whose path starts with ``prefix`` to ``matched``."""

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        app = matched if scope["path"].startswith(prefix) else other
        await app(scope, receive, send)

    return route
