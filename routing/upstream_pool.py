"""A lean HTTP/1.1 keep-alive client for the relay's one job: POST, then stream the body.

Why not httpx on this path: under load the balancer spent a third or more of its
CPU inside httpx/httpcore (docs/performance.md), most of it in the connection
pool, which on every request start and end walks *every* pooled connection and
asks each socket whether it is readable (anyio's typed-attribute lookups and a
``select`` per idle connection), so the cost per request grows with the number
of streams in flight.  Here each origin has a stack of idle connections: taking
one and putting it back is O(1), and a connection the server closed is known
from ``connection_lost`` instead of by polling its socket.  Responses are parsed
by httptools (C), the parser uvicorn and the emulated replicas use
(``routing.upstream_connection``).

Semantics the dispatcher relies on:

* ``UpstreamError`` for every network or protocol failure (refused, reset,
  timeout, malformed response); the read timeout applies to each wait for
  bytes, the connect timeout to opening a connection;
* a response framed by neither ``Content-Length`` nor chunks ends where the
  server closes the connection (HTTP/1.0 style, as some ``/metrics`` exporters
  answer), as with httpx;
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
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

from routing.upstream_connection import (
    HIGH_WATER,
    BodySink,
    UpstreamConnection,
    UpstreamError,
    UpstreamTimeout,
)

__all__ = [
    "HIGH_WATER",
    "BodySink",
    "ResponseHeaders",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "UpstreamTimeout",
]

MAX_IDLE_PER_ORIGIN = 256
MAX_CONNECTING_PER_ORIGIN = 32

Origin = tuple[str, int, bool]  # host, port, TLS


class ResponseHeaders:
    """A response head's headers, read as ``httpx.Headers`` reads them: names in any
    case; a repeated header's values joined with ``", "``; all names and values decoded
    as ASCII, else UTF-8 if all of them are, else ISO-8859-1.  Looked up in the list
    the parser gave: a head has a handful of headers and the relay reads one or two,
    so nothing is built per response (``httpx.Headers`` cost ~2 µs to build and ~1 µs
    per lookup)."""

    __slots__ = ("_encoding", "raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw
        self._encoding: str | None = None

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._values(name)
        return ", ".join(values) if values else default

    def __getitem__(self, name: str) -> str:
        values = self._values(name)
        if not values:
            raise KeyError(name)
        return ", ".join(values)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self._values(name))

    def _values(self, name: str) -> list[str]:
        encoding = self._encoding or self._choose_encoding()
        wanted = name.lower().encode(encoding)
        return [value.decode(encoding) for key, value in self.raw if key.lower() == wanted]

    def _choose_encoding(self) -> str:
        for encoding in ("ascii", "utf-8"):
            try:
                for key, value in self.raw:
                    key.decode(encoding)
                    value.decode(encoding)
            except UnicodeDecodeError:
                continue
            self._encoding = encoding
            return encoding
        self._encoding = "iso-8859-1"
        return "iso-8859-1"


class UpstreamResponse:
    """An upstream response whose head has arrived; the body streams from ``aiter_raw``."""

    def __init__(self, pool: UpstreamPool, origin: Origin, conn: UpstreamConnection) -> None:
        self._pool, self._origin, self._conn = pool, origin, conn
        self.status_code = conn.status
        self.headers = ResponseHeaders(conn.headers)
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
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        self._closed = False
        self._tls: ssl.SSLContext | None = None  # made on the first https:// upstream
        self._warming: set[Origin] = set()
        # Every connection opened, busy or idle (weak: a closed one just goes away).
        self._opened: dict[Origin, weakref.WeakSet[UpstreamConnection]] = {}
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

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """GET ``url`` and read its whole body: (status, body); ``UpstreamError`` on
        failure.  ``timeout_s`` replaces the pool's timeouts for this call: it bounds
        the connect and each wait for bytes (a probe's own timeout, as httpx applied
        it).  No ``Accept-Encoding``: the body comes as it is, nothing to inflate."""
        origin, head = _get_head(url)
        conn = self._checkout(origin) or await self._connect_queued(origin, timeout_s)
        try:
            return await self._read_whole(origin, conn, head, timeout_s)
        except UpstreamError:
            if not (conn.reused and not conn.received):
                raise
        # The server closed the idle connection as we reused it: it saw nothing.
        conn = await self._connect(origin, timeout_s)
        return await self._read_whole(origin, conn, head, timeout_s)

    async def _read_whole(
        self, origin: Origin, conn: UpstreamConnection, request: bytes, timeout_s: float
    ) -> tuple[int, bytes]:
        body: list[bytes] = []
        try:
            conn.send(request)
            while not conn.complete:
                await conn.wait(timeout_s)
                if conn.chunks:  # taken as they come: a body past HIGH_WATER pauses reading
                    body.append(conn.take())
        except BaseException:
            conn.close()
            raise
        if conn.chunks:
            body.append(conn.take())
        self.release(origin, conn)
        return conn.status, b"".join(body)

    async def _exchange(
        self, origin: Origin, conn: UpstreamConnection, data: bytes
    ) -> UpstreamResponse:
        try:
            conn.send(data)
            while not conn.head_done:
                await conn.wait(self.read_timeout_s)
        except BaseException:
            conn.close()
            raise
        conn.heard_at = conn.loop.time()  # a relayed request's answer: a sign of life
        return UpstreamResponse(self, origin, conn)

    def _checkout(self, origin: Origin) -> UpstreamConnection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have timed out
            if not conn.lost:
                conn.reused = True
                return conn
        return None

    async def _connect_queued(
        self, origin: Origin, timeout_s: float | None = None
    ) -> UpstreamConnection:
        """A connection for a request: queued behind the connects under way, and an
        idle one if a request gave one back while this one waited."""
        async with self._gate(origin):
            return self._checkout(origin) or await self._open(origin, timeout_s)

    def _gate(self, origin: Origin) -> asyncio.Semaphore:
        gate = self._connecting.get(origin)
        if gate is None:
            gate = self._connecting[origin] = asyncio.Semaphore(MAX_CONNECTING_PER_ORIGIN)
        return gate

    async def _connect(self, origin: Origin, timeout_s: float | None = None) -> UpstreamConnection:
        async with self._gate(origin):
            return await self._open(origin, timeout_s)

    async def _open(self, origin: Origin, timeout_s: float | None = None) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        host, port, tls = origin
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: UpstreamConnection(loop), host, port, ssl=self._tls if tls else None
                ),
                self.connect_timeout_s if timeout_s is None else timeout_s,
            )
        except TimeoutError as exc:
            raise UpstreamTimeout(f"connect to {host}:{port} timed out") from exc
        except OSError as exc:
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
        fresh = [conn for conn in opened if isinstance(conn, UpstreamConnection)]
        if self._closed:
            for conn in fresh:
                conn.close()
            return 0
        # Never used, so idle as they are (``release`` is for connections after a response).
        idle.extend(fresh)
        return len(fresh)

    def heard_from(self, url: str) -> float | None:
        """When a relayed response from ``url``'s origin last brought bytes (the event
        loop's time), over the pool's connections (a closed one is forgotten once
        nothing holds it); None if none did.  The
        probes' own answers do not count: a replica that stopped serving requests must
        not look alive for as long as its last ``/metrics`` page is recent."""
        heard = max((conn.heard_at for conn in self._opened.get(_origin(url), ())), default=0.0)
        return heard or None

    def release(self, origin: Origin, conn: UpstreamConnection) -> None:
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


@functools.lru_cache(maxsize=1024)
def _get_head(url: str) -> tuple[Origin, bytes]:
    """``url``'s origin and the whole of a GET to it (the probes' URLs are few)."""
    origin, start = _start_lines(url)
    return origin, ("GET" + start.removeprefix("POST") + "\r\n\r\n").encode("latin-1")


def _request_head(url: str, headers: Mapping[str, str], length: int) -> tuple[Origin, bytes]:
    origin, start = _start_lines(url)
    lines = [start]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {length}")
    return origin, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
