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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.urls import set_script_prefix

from routing.asgi_types import ASGIApp, Receive, Scope, Send

API_PREFIX = "/v1/"


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
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)

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
                case (None, error_response):
                    await self.send_response(error_response, send)
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
