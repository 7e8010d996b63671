"""The ASGI callables' types, shared by the balancer's ASGI pieces.

They are the types Django's own ``ASGIHandler`` declares (django-stubs): a scope is a
dict, messages are read-only mappings either way.  ``BodyLimitMiddleware`` wraps
``by_path_prefix``, which hands requests to ``ApiASGIHandler`` or to Django's handler,
so one set of types lets each be passed where the next is expected.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The scope extension under which the balancer's HTTP server offers a ``BodyWriter``
# for the request's response (``routing.http_protocol``); other servers offer none.
DIRECT_BODY = "meridian.direct_body"


class BodyWriter(Protocol):
    """Writes a started, chunked response's body to the client without ASGI messages.

    A relay starts the response with ``start``, writes each upstream read with
    ``write`` from the upstream connection's own callbacks and ends the response with
    ``finish`` (no ASGI message after it).  A response whose body is one message goes
    out whole, head and body in one write (``whole``).
    """

    async def start(self, send: Send, message: Message) -> None:
        """Send ``http.response.start`` through ``send``, the head it writes held back
        to go out with the body's first bytes (or at ``release``)."""
        ...

    async def whole(self, send: Send, start: Message, body: Message) -> None:
        """Send ``http.response.start`` and one last ``http.response.body`` through
        ``send``, what they write going out in one write."""
        ...

    def usable(self) -> bool:
        """Whether the response was started chunked and the client is still there."""
        ...

    def write(self, data: bytes) -> None:
        """One chunk of the body (dropped once the client is gone); with no bytes,
        only the head still held, if it is."""
        ...

    def finish(self, data: bytes) -> None:
        """The last bytes of the body (maybe none) and its end, in one write."""
        ...

    def hold(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        """``pause`` when the client's buffer is full (now, if it is), ``resume`` when
        it drained, until ``release``."""
        ...

    def release(self) -> None:
        """No more calls of the ``hold`` callbacks; a head still held is written."""
        ...
