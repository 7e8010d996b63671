"""uvicorn's HTTP protocol with read deadlines and a header size limit.

uvicorn (0.54, httptools) arms only a keep-alive timer, after a response: a client
that opens a connection and sends half a request line, or headers without their
blank line, or a body that stops halfway, holds its connection and its memory
forever, and the parser buffers a header line of any length.  A balancer's port
faces every client, so ``GuardedHttpToolsProtocol`` adds what a front proxy would:

* the request line and headers must be complete within ``MERIDIAN_HEADER_TIMEOUT_S``
  of their first byte (or of the connection opening; for a pipelined request, of the
  answer to the one before): else 408 and close;
* once the headers are in, the body may pause at most ``MERIDIAN_BODY_TIMEOUT_S``
  between chunks: else the connection closes (the app sees a disconnect);
* the request line and headers may hold at most ``MERIDIAN_MAX_HEADER_BYTES``,
  counted as they arrive, so a never-ending header line is refused too: 431 and close;
* an idle keep-alive connection closes after ``MERIDIAN_KEEPALIVE_TIMEOUT_S``.

Once a request is complete no deadline runs: a long streamed answer is the app's
business.  ``ops.stack.plan.balancer_argv`` passes this class to uvicorn's
``--http``.  (Under daphne, Twisted refuses headers past 16 KiB itself but has no
header or body deadline shorter than its 12-hour idle timeout: serve balancers with
uvicorn where clients are not trusted, or put a front proxy before daphne.)

Each request's scope also offers a ``DirectBody`` (``routing.asgi_types.DIRECT_BODY``):
the plain ``/v1`` path relays a stream's upstream reads through it straight to this
connection's transport, chunk-framed as uvicorn frames a body, instead of one ASGI
``send`` per read; the transport's pause and resume of writing reach the relay, so a
slow client still holds the upstream back.  A non-streamed answer goes through it as
one write, head and body together (``DirectBody.whole``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from core import errors
from routing.asgi_types import DIRECT_BODY, Message, Send


@dataclass(frozen=True, slots=True)
class ReadLimits:
    header_timeout_s: float
    body_timeout_s: float
    keepalive_timeout_s: float
    max_header_bytes: int


@cache
def configured_limits() -> ReadLimits:
    return ReadLimits(
        header_timeout_s=settings.MERIDIAN_HEADER_TIMEOUT_S,
        body_timeout_s=settings.MERIDIAN_BODY_TIMEOUT_S,
        keepalive_timeout_s=settings.MERIDIAN_KEEPALIVE_TIMEOUT_S,
        max_header_bytes=settings.MERIDIAN_MAX_HEADER_BYTES,
    )


class _HeadersTooLarge(Exception):
    """Raised from a parser callback to stop parsing; answered 431."""


def _ignore() -> None:
    """What a direct body's pause and resume do when no relay holds them."""


class _HeldWrites:
    """Stands in for the transport while uvicorn writes a response head (or a whole
    response): keeps what it writes, which ``flush`` writes as one."""

    __slots__ = ("_transport", "data")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def flush(self) -> None:
        if self.data:
            self._transport.write(self.data)
            self.data = b""

    def close(self) -> None:
        # A response on a connection that does not stay alive: written, then closed.
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class DirectBody:
    """One request's ``BodyWriter``: its response body written to the transport here."""

    __slots__ = ("_cycle", "_head", "_pause", "_protocol", "_resume", "_transport")

    def __init__(self, protocol: GuardedHttpToolsProtocol, cycle: RequestResponseCycle) -> None:
        self._protocol = protocol
        self._cycle = cycle
        self._transport = cycle.transport
        self._head = b""  # the response head, until the body's first write takes it
        self._pause: Callable[[], None] = _ignore
        self._resume: Callable[[], None] = _ignore

    async def start(self, send: Send, message: Message) -> None:
        # uvicorn builds and writes the head (its default headers, checks, framing
        # choice); it goes out with the first chunk, one write and one packet fewer.
        cycle = self._cycle
        held = _HeldWrites(self._transport)
        cycle.transport = held  # type: ignore[assignment]
        try:
            await send(message)
        finally:
            cycle.transport = self._transport
        self._head = held.data

    async def whole(self, send: Send, start: Message, body: Message) -> None:
        # A response whose body is one message: uvicorn builds the head and frames the
        # body as usual, and both go out in one write (one system call, one packet).
        cycle = self._cycle
        held = _HeldWrites(self._transport)
        cycle.transport = held  # type: ignore[assignment]
        try:
            await send(start)
            await send(body)
        finally:
            cycle.transport = self._transport
            held.flush()

    def usable(self) -> bool:
        cycle = self._cycle
        return (
            cycle.response_started
            and cycle.chunked_encoding is True
            and not cycle.response_complete
            and not cycle.disconnected
        )

    def write(self, data: bytes) -> None:
        if self._cycle.disconnected:
            return
        framed = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
        if self._head:
            framed, self._head = self._head + framed, b""
        if framed:
            self._transport.write(framed)

    def finish(self, data: bytes) -> None:
        # What uvicorn's ``RequestResponseCycle.send`` does with a last body message,
        # the last chunk and the terminating one in one write.
        cycle = self._cycle
        if cycle.disconnected or cycle.response_complete:
            return
        last = b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n"
        self._transport.write(self._head + last)
        self._head = b""
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self._transport.close()
        cycle.on_response()

    def hold(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self._pause, self._resume = pause, resume
        self._protocol.direct = self
        if self._protocol.flow.write_paused:
            pause()

    def release(self) -> None:
        self._pause = self._resume = _ignore
        if self._protocol.direct is self:
            self._protocol.direct = None
        if self._head and not self._cycle.disconnected:
            self._transport.write(self._head)
        self._head = b""

    def paused(self) -> None:
        self._pause()

    def resumed(self) -> None:
        self._resume()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    # Set in connection_made / on_message_begin; None while no deadline runs.
    _deadline: asyncio.TimerHandle | None = None
    # The body being written directly, if one is (``DirectBody.hold``).
    direct: DirectBody | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = self.read_limits()
        self.timeout_keep_alive = int(max(1.0, self.limits.keepalive_timeout_s))
        self._reading_headers = True
        self._parsed_header_bytes = 0  # complete request line and header lines
        self._unparsed_header_bytes = 0  # bytes read while the headers were incomplete
        self._refusal: tuple[int, bytes] | None = None
        # A request's first byte is parsed and its headers are not complete yet.
        self._request_begun = False

    @classmethod
    def read_limits(cls) -> ReadLimits:
        return configured_limits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._headers_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading_headers and self._deadline is None and not self._responding():
            # The first byte of a request on a kept-alive connection.
            self._arm(self.limits.header_timeout_s, self._headers_timed_out)
        super().data_received(data)
        if self._reading_headers and not self.transport.is_closing():
            # All of it is header bytes the parser holds, maybe in a line not yet
            # complete (which on_header never sees): bounded here.
            self._unparsed_header_bytes += len(data)
            if self._unparsed_header_bytes > self.limits.max_header_bytes:
                self._refusal = _TOO_LARGE
                self.send_400_response("")

    # Parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_headers()
        self._request_begun = True

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._request_begun = False
        self._arm(self.limits.body_timeout_s, self._body_timed_out)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not an upgrade
            extensions: dict[str, object] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[DIRECT_BODY] = DirectBody(self, cycle)

    def on_body(self, body: bytes) -> None:
        self._arm(self.limits.body_timeout_s, self._body_timed_out)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._start_headers()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._request_begun and self._deadline is None and not self.transport.is_closing():
            # The next request began arriving while this one was answered and its
            # headers are still incomplete: they get their deadline from now (and a 408),
            # not the keep-alive's close without a word that uvicorn just armed.
            self._unset_keepalive_if_required()
            self._arm(self.limits.header_timeout_s, self._headers_timed_out)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.direct is not None:
            self.direct.paused()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.direct is not None:
            self.direct.resumed()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error 400; a callback that refused knows better.
        if self._refusal is None:
            super().send_400_response(msg)
            return
        status, reason = self._refusal
        self._send_error(status, reason)

    # Deadlines and refusals

    def _start_headers(self) -> None:
        self._reading_headers = True
        self._parsed_header_bytes = 0
        self._unparsed_header_bytes = 0

    def _count_header_bytes(self, size: int) -> None:
        self._parsed_header_bytes += size
        if self._parsed_header_bytes > self.limits.max_header_bytes:
            self._refusal = _TOO_LARGE
            raise _HeadersTooLarge  # the parser stops; uvicorn calls send_400_response

    def _responding(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _headers_timed_out(self) -> None:
        self._deadline = None
        # A pipelined request waits while the one before is answered; that is no stall.
        if not self.transport.is_closing() and not self._responding():
            self._send_error(408, b"Request Timeout")

    def _body_timed_out(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            # The app is waiting on the body; it sees the disconnect and gives up.
            self.transport.close()

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _send_error(self, status: int, reason: bytes) -> None:
        self._disarm()
        error = errors.ApiError(status, reason.decode(), code=_CODES[status])
        body = json.dumps(error.body()).encode()
        head = b"HTTP/1.1 %d %s\r\n" % (status, reason) + (
            b"content-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % len(body)
        )
        self.transport.write(head + body)
        self.transport.close()


_TOO_LARGE = (431, b"Request Header Fields Too Large")
_CODES = {408: "request_timeout", 431: "headers_too_large"}
