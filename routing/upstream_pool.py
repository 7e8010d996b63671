"""A lean HTTP/1.1 keep-alive client for the relay's one job: POST, then stream the body.

Why not httpx on this path: under load the balancer spent a third or more of its
CPU inside httpx/httpcore (docs/performance.md), most of it in the connection
pool, which on every request start and end walks *every* pooled connection and
asks each socket whether it is readable (anyio's typed-attribute lookups and a
``select`` per idle connection), so the cost per request grows with the number
of streams in flight.  Here each origin has a stack of idle connections: taking
one and putting it back is O(1), and a connection the server closed is known
from ``connection_lost`` instead of by polling its socket.  Responses are parsed
by httptools (C), the parser uvicorn and the emulated replicas use.

Semantics the dispatcher relies on:

* ``UpstreamError`` for every network or protocol failure (refused, reset,
  timeout, malformed response); the read timeout applies to each wait for
  bytes, the connect timeout to opening a connection;
* a request on a reused connection that the server closed before answering
  (its keep-alive timer ran out as we sent) is sent again once on a fresh
  connection: nothing of it was processed;
* closing a response before its end closes the connection, so the replica sees
  the disconnect and aborts the generation, as with httpx;
* reading pauses the socket once ``HIGH_WATER`` bytes wait unread, so a slow
  client never makes the balancer buffer a whole stream;
* ``UpstreamResponse.stream_to`` hands the rest of a body to a ``BodySink`` from the
  parser's own callbacks instead: no future or task step per read, for a relay
  that writes each read straight to its client (``routing.upstream``); the
  read timeout still bounds each silence, and the sink pauses reading while its
  client cannot take more;
* at most ``MAX_CONNECTING_PER_ORIGIN`` connections are being opened to one
  origin at a time.  A burst on a cold pool queues for its turn, and a queued
  request takes a connection that another one gave back in the meantime; the
  connect timeout runs only while its own connect does, never while it queues.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import weakref
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools
import httpx

HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
MAX_IDLE_PER_ORIGIN = 256
MAX_CONNECTING_PER_ORIGIN = 32

Origin = tuple[str, int, bool]  # host, port, TLS


class UpstreamError(Exception):
    """A network or protocol failure talking to an upstream."""


class BodySink(Protocol):
    """Takes a response body as the connection reads it (``UpstreamResponse.stream_to``)."""

    def body(self, data: bytes) -> None:
        """Bytes of the body, as one read brought them."""

    def end(self, error: BaseException | None, rest: bytes) -> None:
        """The body is complete (``error`` None) or failed; ``rest`` is what the last
        read brought (maybe nothing), not given to ``body``.  Called once, and nothing
        after it."""


class _Connection(asyncio.Protocol):
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
        if not self.complete:
            reason = f"connection lost: {exc}" if exc else "server closed the connection"
            self._fail(UpstreamError(reason))

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
            sink.end(None, data)  # with the end: the client's last write ends its body too
        elif data:
            self._waiting_since = self.loop.time()  # what the read timeout measures from
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
            waiter.set_exception(UpstreamError("read timed out"))
        else:
            self._timer = self.loop.call_later(self._timeout - waited, self._check_timeout)

    def _check_sink_timeout(self) -> None:
        if self.sink_paused:
            return  # the client holds the stream back, not the upstream: resuming re-arms
        waited = self.loop.time() - self._waiting_since
        if waited >= self._timeout:
            self._fail(UpstreamError("read timed out"))
        else:
            self._timer = self.loop.call_later(self._timeout - waited, self._check_timeout)


class UpstreamResponse:
    """An upstream response whose head has arrived; the body streams from ``aiter_raw``."""

    def __init__(self, pool: UpstreamPool, origin: Origin, conn: _Connection) -> None:
        self._pool, self._origin, self._conn = pool, origin, conn
        self.status_code = conn.status
        self.headers = httpx.Headers(conn.headers)
        self._released = False

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        conn, timeout = self._conn, self._pool.read_timeout_s
        while True:
            if conn.chunks:
                yield conn.take()
            elif conn.complete:
                break
            else:
                await conn.wait(timeout)
        self._release()

    def stream_to(self, sink: BodySink) -> None:
        """Hand the rest of the body to ``sink`` from the connection's callbacks (what
        is buffered at once); the connection goes back to the pool on ``aclose``, which
        detaches the sink.  Instead of ``aiter_raw``, never besides it."""
        self._conn.stream_to(sink, self._pool.read_timeout_s)

    def pause_reading(self) -> None:
        """While streaming to a sink: stop reading (the sink's client is slow)."""
        self._conn.pause_sink()

    def resume_reading(self) -> None:
        self._conn.resume_sink()

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aclose(self) -> None:
        self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self._conn.detach_sink()
        self._pool.release(self._origin, self._conn)


class UpstreamPool:
    """Keep-alive connections by origin; the relay's replacement for ``httpx.AsyncClient``."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._closed = False
        self._tls: ssl.SSLContext | None = None  # made on the first https:// upstream
        self._warming: set[Origin] = set()
        # Every connection opened, busy or idle (weak: a closed one just goes away).
        self._opened: dict[Origin, weakref.WeakSet[_Connection]] = {}
        # Connects under way per origin are bounded; the rest queue (see the docstring).
        self._connecting: dict[Origin, asyncio.Semaphore] = {}

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> UpstreamResponse:
        """Send a POST and wait for the response head; ``UpstreamError`` on failure."""
        origin, head = _request_head(url, headers, len(body))
        conn = self._checkout(origin) or await self._connect_queued(origin)
        try:
            return await self._exchange(origin, conn, head + body)
        except UpstreamError:
            if not (conn.reused and not conn.received):
                raise
        # The server closed the idle connection as we reused it: it saw nothing.
        return await self._exchange(origin, await self._connect(origin), head + body)

    async def _exchange(self, origin: Origin, conn: _Connection, data: bytes) -> UpstreamResponse:
        try:
            conn.send(data)
            while not conn.head_done:
                await conn.wait(self.read_timeout_s)
        except BaseException:
            conn.close()
            raise
        return UpstreamResponse(self, origin, conn)

    def _checkout(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have timed out
            if not conn.lost:
                conn.reused = True
                return conn
        return None

    async def _connect_queued(self, origin: Origin) -> _Connection:
        """A connection for a request: queued behind the connects under way, and an
        idle one if a request gave one back while this one waited."""
        async with self._gate(origin):
            return self._checkout(origin) or await self._open(origin)

    def _gate(self, origin: Origin) -> asyncio.Semaphore:
        gate = self._connecting.get(origin)
        if gate is None:
            gate = self._connecting[origin] = asyncio.Semaphore(MAX_CONNECTING_PER_ORIGIN)
        return gate

    async def _connect(self, origin: Origin) -> _Connection:
        async with self._gate(origin):
            return await self._open(origin)

    async def _open(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        host, port, tls = origin
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop), host, port, ssl=self._tls if tls else None
                ),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"connect to {host}:{port} failed: {exc!r}") from exc
        self._opened.setdefault(origin, weakref.WeakSet()).add(conn)
        return conn

    async def warm(self, url: str, connections: int) -> int:
        """Open connections to ``url``'s origin until it has ``connections`` open, busy
        or idle; the number opened.  A burst on a cold pool otherwise opens one connection per
        request at once, on the same loop that is parsing the burst, and connects
        that wait behind it can run past the connect timeout.  A failure is left to
        the prober, which sees the replica down on its own."""
        origin = _origin(url)
        if self._closed or origin in self._warming:
            return 0
        idle = self._idle.setdefault(origin, [])
        idle[:] = [conn for conn in idle if not conn.lost]
        live = sum(1 for conn in self._opened.get(origin, ()) if not conn.lost)
        missing = min(connections, MAX_IDLE_PER_ORIGIN) - live
        if missing <= 0:
            return 0
        self._warming.add(origin)
        try:
            opened = await asyncio.gather(
                *(self._connect(origin) for _ in range(missing)), return_exceptions=True
            )
        finally:
            self._warming.discard(origin)
        fresh = [conn for conn in opened if isinstance(conn, _Connection)]
        if self._closed:
            for conn in fresh:
                conn.close()
            return 0
        # Never used, so idle as they are (``release`` is for connections after a response).
        idle.extend(fresh)
        return len(fresh)

    def release(self, origin: Origin, conn: _Connection) -> None:
        """Back to the idle stack when its response was read to the end, else closed."""
        idle = self._idle.setdefault(origin, [])
        if self._closed or not conn.reusable() or len(idle) >= MAX_IDLE_PER_ORIGIN:
            conn.close()
            return
        conn.reused = False
        idle.append(conn)

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _origin(url: str) -> Origin:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    return parts.hostname, parts.port or (443 if tls else 80), tls


@functools.lru_cache(maxsize=1024)
def _start_lines(url: str) -> tuple[Origin, str]:
    """``url``'s origin and the request line and ``Host`` line of a POST to it.  The
    URLs are few (each replica's and peer's, per endpoint), so each is parsed once,
    not per request; a bad one raises every time (exceptions are not cached)."""
    parts = urlsplit(url)
    origin = _origin(url)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return origin, f"POST {target} HTTP/1.1\r\nHost: {parts.hostname}:{origin[1]}"


def _request_head(url: str, headers: Mapping[str, str], length: int) -> tuple[Origin, bytes]:
    origin, start = _start_lines(url)
    lines = [start]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {length}")
    return origin, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
