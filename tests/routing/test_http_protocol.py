"""A balancer's HTTP server drops stalled and oversized requests (``routing.http_protocol``).

A real uvicorn server on loopback, with the guarded protocol and short limits,
and raw sockets playing the slow or hostile clients.  Every wait has a generous
bound that only a hang would reach; nothing asserts how fast anything happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import uvicorn

from routing.asgi_types import DIRECT_BODY, Receive, Scope, Send
from routing.http_protocol import GuardedHttpToolsProtocol, ReadLimits

pytestmark = pytest.mark.anyio

LIMITS = ReadLimits(
    header_timeout_s=0.3, body_timeout_s=0.3, keepalive_timeout_s=1.0, max_header_bytes=4096
)
HANG = 20.0  # only a connection left open forever waits this long


class ShortLimits(GuardedHttpToolsProtocol):
    @classmethod
    def read_limits(cls) -> ReadLimits:
        return LIMITS


@dataclass
class EchoApp:
    """Answers with the body's length; records whether a client left mid-body."""

    disconnects: int = 0
    bodies: list[bytes] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnects += 1
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        answer = str(len(body)).encode()
        length = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": length})
        await send({"type": "http.response.body", "body": answer})


@dataclass
class Served:
    app: EchoApp
    port: int


@contextlib.asynccontextmanager
async def serving(
    app: object, http: type[GuardedHttpToolsProtocol] = ShortLimits
) -> AsyncIterator[uvicorn.Server]:
    """``app`` under a real uvicorn with the guarded protocol, on a free loopback port."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, http=http, lifespan="off", log_level="error"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        await task


def port_of(server: uvicorn.Server) -> int:
    return int(server.servers[0].sockets[0].getsockname()[1])


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    app = EchoApp()
    async with serving(app) as server:
        yield Served(app, port_of(server))


async def exchange(port: int, *chunks: bytes) -> bytes:
    """Send ``chunks``, then read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for chunk in chunks:
        writer.write(chunk)
        await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), HANG)
    finally:
        writer.close()


def status_and_body(reply: bytes) -> tuple[int, bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_a_partial_request_line_is_answered_408_and_closed(served: Served) -> None:
    status, body = status_and_body(await exchange(served.port, b"POST /v1/compl"))
    assert status == 408
    assert json.loads(body)["error"]["code"] == "request_timeout"


async def test_a_connection_that_sends_nothing_is_closed(served: Served) -> None:
    assert status_and_body(await exchange(served.port))[0] == 408


async def test_headers_without_their_blank_line_are_answered_408(served: Served) -> None:
    reply = await exchange(served.port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n")
    assert status_and_body(reply)[0] == 408


async def test_a_body_that_stops_halfway_closes_the_connection(served: Served) -> None:
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    assert await exchange(served.port, head, b"x" * 10) == b""
    assert (served.app.disconnects, served.app.bodies) == (1, [])


async def test_a_header_line_that_never_ends_is_answered_431(served: Served) -> None:
    too_long = LIMITS.max_header_bytes * 2
    reply = await exchange(served.port, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * too_long)
    status, body = status_and_body(reply)
    assert status == 431
    assert json.loads(body)["error"]["code"] == "headers_too_large"


async def test_a_megabyte_header_value_is_cut_off(served: Served) -> None:
    # The server closes with most of the megabyte unread, so the kernel may reset
    # the connection before the 431 reaches the client: either way it is over.
    try:
        reply = await exchange(served.port, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 1_000_000)
    except ConnectionError:  # reset while reading, or a broken pipe while sending
        return
    assert status_and_body(reply)[0] == 431


async def test_many_small_headers_past_the_limit_are_answered_431(served: Served) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(60))
    reply = await exchange(served.port, b"GET / HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert status_and_body(reply)[0] == 431


async def test_a_well_behaved_request_is_answered_then_idles_out(served: Served) -> None:
    request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    # The client keeps the connection alive; the server ends it after the keep-alive.
    status, body = status_and_body(await exchange(served.port, request))
    assert (status, body) == (200, b"5")
    assert served.app.disconnects == 0


# Deadlines far apart, so that a busy machine's scheduling delays (tenths of a
# second) never decide which one runs out first.
PATIENT = ReadLimits(
    header_timeout_s=0.3, body_timeout_s=1.0, keepalive_timeout_s=10.0, max_header_bytes=4096
)


class PatientLimits(GuardedHttpToolsProtocol):
    @classmethod
    def read_limits(cls) -> ReadLimits:
        return PATIENT


async def test_a_body_arriving_in_time_part_after_part_is_never_cut() -> None:
    # Each part comes a quarter of the body deadline after the one before; the whole
    # takes one and a half deadlines.
    app = EchoApp()
    async with serving(app, PatientLimits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n")
        for part in (b"a", b"b", b"c", b"d", b"e", b"f"):
            await asyncio.sleep(PATIENT.body_timeout_s / 4)
            writer.write(part)
            await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200") and app.bodies == [b"abcdef"]


async def test_a_stall_after_a_kept_alive_request_is_still_answered_408() -> None:
    async with serving(EchoApp(), PatientLimits) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG)
        assert head.startswith(b"HTTP/1.1 200")
        assert await asyncio.wait_for(reader.readexactly(1), HANG) == b"2"
        # Answered; the next request's line never ends: its own header deadline runs
        # out, long before the keep-alive's (which would close without a word).
        writer.write(b"POST /v1/compl")
        reply = await asyncio.wait_for(reader.read(), HANG)
        writer.close()
    assert status_and_body(reply)[0] == 408


async def test_a_pipelined_request_stalled_in_its_headers_is_answered_408() -> None:
    # The second request's line arrives with the first request, and never ends: once
    # the first is answered, the second's header deadline runs, not the keep-alive's.
    first = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    async with serving(EchoApp(), PatientLimits) as server:
        reply = await exchange(port_of(server), first + b"POST /v1/compl")
    answered, _, rest = reply.partition(b"\r\n\r\n2")
    assert answered.startswith(b"HTTP/1.1 200")
    assert status_and_body(rest)[0] == 408


@dataclass
class DirectApp:
    """Streams through the scope's ``DirectBody``: the head with one part, then the last
    with the end once ``go_on`` is set; records the pauses and resumes it was told of."""

    events: list[str] = field(default_factory=list)
    go_on: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        direct = scope["extensions"][DIRECT_BODY]
        await direct.start(send, {"type": "http.response.start", "status": 200, "headers": []})
        assert direct.usable()
        direct.hold(lambda: self.events.append("pause"), lambda: self.events.append("resume"))
        direct.write(b"one")
        await self.go_on.wait()
        direct.release()
        direct.finish(b"two")


async def test_a_direct_body_is_chunked_follows_its_clients_buffer_and_keeps_alive() -> None:
    app = DirectApp()
    async with serving(app) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG)
            assert b"transfer-encoding: chunked" in head
            assert await asyncio.wait_for(reader.readuntil(b"one\r\n"), HANG) == b"3\r\none\r\n"
            (protocol,) = server.server_state.connections
            # What the transport calls past its high-water mark and once drained.
            protocol.pause_writing()
            protocol.resume_writing()
            app.go_on.set()
            end = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), HANG)
            assert end == b"3\r\ntwo\r\n0\r\n\r\n"
            protocol.pause_writing()  # released: its relay hears of it no more
            protocol.resume_writing()
            assert app.events == ["pause", "resume"]
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # the connection is still usable
            again = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), HANG)
            assert again.startswith(b"HTTP/1.1 200") and again.endswith(b"3\r\ntwo\r\n0\r\n\r\n")
        finally:
            writer.close()


@dataclass
class WholeApp:
    """Answers each request whole through the scope's ``DirectBody``; ``close`` asks for
    the connection to end after the answer.  Records what the server wrote, write by write."""

    writes: list[bytes] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        direct = scope["extensions"][DIRECT_BODY]
        transport = direct._transport
        real_write = transport.write

        def write(data: bytes) -> None:
            self.writes.append(bytes(data))
            real_write(data)

        transport.write = write  # this connection's writes, seen here
        close = [(b"connection", b"close")] if scope["path"] == "/close" else []
        headers = [(b"content-length", b"5"), *close]
        start = {"type": "http.response.start", "status": 200, "headers": headers}
        await direct.whole(send, start, {"type": "http.response.body", "body": b"hello"})
        del transport.write


async def test_a_whole_response_is_one_write_and_its_connection_stays_usable() -> None:
    app = WholeApp()
    async with serving(app) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        try:
            for _ in range(2):  # the second on the same connection
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANG)
                assert head.startswith(b"HTTP/1.1 200") and b"content-length: 5\r\n" in head
                assert await asyncio.wait_for(reader.readexactly(5), HANG) == b"hello"
        finally:
            writer.close()
    assert len(app.writes) == 2
    assert all(write.startswith(b"HTTP/1.1 200") for write in app.writes)
    assert all(write.endswith(b"\r\n\r\nhello") for write in app.writes)


async def test_a_whole_response_on_a_closing_connection_is_written_before_the_close() -> None:
    app = WholeApp()
    async with serving(app) as server:
        reply = await exchange(port_of(server), b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
        status, body = status_and_body(reply)
        assert (status, body) == (200, b"hello")
        assert b"connection: close\r\n" in reply
    assert len(app.writes) == 1
