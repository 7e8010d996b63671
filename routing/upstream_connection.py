"""One HTTP/1.1 connection of the relay's pool (``routing.upstream_pool``), parsed by httptools.

One request at a time.  The response body is either buffered for ``wait``/``take``
(``UpstreamResponse.aiter_raw``: one wake of the reading task per read) or handed
to a ``BodySink`` from the read callback itself (``stream_to``: what one read
brought, as one piece however many chunks framed it, with no future or task step
per read).  Either way:

* reading pauses once ``HIGH_WATER`` bytes wait unread, or while a sink's client
  cannot take more (``pause_sink``), so a slow client never makes the balancer
  buffer a whole stream;
* the read timeout bounds each silence of the upstream, with one timer per
  connection, never one per read; no timeout runs while a sink holds reading back;
* a failure (reset, timeout, malformed response) is an ``UpstreamError``, raised
  to the waiting task or handed to the sink after what the last read brought; a
  timeout is the subclass ``UpstreamTimeout`` (a slow upstream is not a dead one:
  ``routing.prober``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol, cast

import httptools

HIGH_WATER = 256 * 1024


class UpstreamError(Exception):
    """A network or protocol failure talking to an upstream."""


class UpstreamTimeout(UpstreamError):
    """The upstream kept silent past a timeout (connecting, or waiting for bytes): it
    may be gone, or only too busy to answer in time; a refusal or a reset is not this."""


class BodySink(Protocol):
    """Takes a response body as the connection reads it (``UpstreamResponse.stream_to``)."""

    def body(self, data: bytes) -> None:
        """Bytes of the body, as one read brought them."""

    def end(self, error: BaseException | None, rest: bytes) -> None:
        """The body is complete (``error`` None) or failed; ``rest`` is what the last
        read brought (maybe nothing), not given to ``body``.  Called once, and nothing
        after it."""


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection; one request at a time, fed by httptools callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.reused = False
        # The read timeout's one timer (see ``wait``) and what it checks.
        self._timer: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0
        self._timeout = 0.0
        # When a relayed response last brought bytes (loop time; 0: never): the
        # upstream's latest sign of life to the prober (``UpstreamPool.heard_from``).
        self.heard_at = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.keep_alive = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.received = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.sink: BodySink | None = None
        self.sink_paused = False

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, but not necessarily an asyncio.Transport subclass: uvloop's
        # TCPTransport is not one, and uvicorn runs on uvloop whenever it is installed.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed response: {exc}"))
        if self.sink is not None:
            self._feed_sink()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.complete:
            return
        if exc is None and self.head_done and self._ends_at_close():
            self.on_message_complete()  # its body ends where the server closed (RFC 9112 §6.3)
            if self.sink is not None:
                self._feed_sink()
            return
        reason = f"connection lost: {exc}" if exc else "server closed the connection"
        self._fail(UpstreamError(reason))

    def _ends_at_close(self) -> bool:
        """A response framed by neither ``Content-Length`` nor ``Transfer-Encoding``:
        an HTTP/1.0-style body, as some exporters' ``/metrics`` answer."""
        return not any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers
        )

    # -- httptools callbacks ----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Asked here: llhttp forgets the answer once the message is complete.
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- the request/response side ----------------------------------------------------------
    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self.transport.write(data)

    async def wait(self, timeout: float) -> None:
        """Until the parser made progress (or failed, or ``timeout`` passed).

        A stream waits once per relayed read, so no timer is armed and cancelled per
        wait: one timer per connection, armed when none is (or when it would fire after
        this wait's deadline), checks when it fires how long the wait in progress has
        lasted and fails it at ``timeout``, or arms itself again for the rest
        (``_check_timeout``)."""
        if self.error is not None:
            raise self.error
        waiter = self.waiter = self.loop.create_future()
        self._waiting_since = now = self.loop.time()
        self._timeout = timeout
        timer = self._timer
        if timer is None or timer.when() > now + timeout:  # none, or too late for this wait
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(now + timeout, self._check_timeout)
        try:
            await waiter
        finally:
            self.waiter = None

    def take(self) -> bytes:
        data = b"".join(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        self.chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            if not self.sink_paused:  # else the sink's client resumes it
                self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.complete and not self.lost and self.keep_alive

    def close(self) -> None:
        self.lost = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self.error = error
        sink = self.sink
        if sink is not None:
            self.sink = None
            sink.end(error, self.take() if self.chunks else b"")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)

    def stream_to(self, sink: BodySink, timeout: float) -> None:
        """The rest of the body to ``sink``: what is buffered now, then each read (once
        the sink's client takes more, if it was paused before)."""
        self.sink = sink
        self._timeout = timeout
        if self.error is not None:
            self._fail(self.error)
        elif not self.sink_paused:
            self._feed_sink()
            if self.sink is not None:
                self._watch_sink()

    def _feed_sink(self) -> None:
        """What one read brought, as one piece however many chunks framed it (the
        client then gets one write per read), and the end if the body is complete."""
        sink = self.sink
        assert sink is not None
        data = self.take() if self.chunks else b""
        if self.complete:
            self.sink = None
            self.heard_at = self.loop.time()
            sink.end(None, data)  # with the end: the client's last write ends its body too
        elif data:
            # What the read timeout measures from, and the upstream's sign of life.
            self._waiting_since = self.heard_at = self.loop.time()
            sink.body(data)

    def pause_sink(self) -> None:
        """Stop reading while the sink's client cannot take more; no timeout meanwhile."""
        if not self.sink_paused and not self.lost:
            self.sink_paused = True
            if self.transport is not None:
                self.transport.pause_reading()

    def resume_sink(self) -> None:
        if not self.sink_paused:
            return
        self.sink_paused = False
        if self.transport is not None and not self.lost and not self.paused:
            self.transport.resume_reading()
        if self.sink is not None:
            if self.chunks or self.complete:
                self._feed_sink()
            if self.sink is not None:
                self._watch_sink()

    def detach_sink(self) -> None:
        """No more callbacks to the sink, and reading as usual again (a paused sink
        whose body completed would otherwise leave a reused connection deaf)."""
        self.sink = None
        if self.sink_paused:
            self.sink_paused = False
            if self.transport is not None and not self.lost:
                self.transport.resume_reading()

    def _watch_sink(self) -> None:
        self._waiting_since = now = self.loop.time()
        timer = self._timer
        if timer is None or timer.when() > now + self._timeout:
            if timer is not None:
                timer.cancel()
            self._timer = self.loop.call_at(now + self._timeout, self._check_timeout)

    def _check_timeout(self) -> None:
        self._timer = None
        if self.sink is not None:
            self._check_sink_timeout()
            return
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # not waiting now: the next wait arms the timer again
        waited = self.loop.time() - self._waiting_since
        if waited >= self._timeout:
            waiter.set_exception(UpstreamTimeout("read timed out"))
        else:
            self._timer = self.loop.call_later(self._timeout - waited, self._check_timeout)

    def _check_sink_timeout(self) -> None:
        if self.sink_paused:
            return  # the client holds the stream back, not the upstream: resuming re-arms
        waited = self.loop.time() - self._waiting_since
        if waited >= self._timeout:
            self._fail(UpstreamTimeout("read timed out"))
        else:
            self._timer = self.loop.call_later(self._timeout - waited, self._check_timeout)
