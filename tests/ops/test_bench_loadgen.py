"""The proxy benchmark's load generator against a server that closes idle connections.

Servers close a kept-alive connection after a few seconds of quiet (uvicorn's
default: 5 s).  A request written onto such a connection as it closes gets no
answer, so the generator opens a connection anew once it has idled past its
expiry.  The server here plays that race without timing it: a request that
arrives ``idle_s`` or more after the connection's last answer is met by the
close, unanswered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from ops.bench.loadgen import HttpError, _Connection, _one, _target

pytestmark = pytest.mark.anyio

SERVER_IDLE_S = 0.2
PAUSE_S = 0.4  # between the two requests: past the server's idle close


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class IdleClosingServer:
    """HTTP/1.1 on loopback: answers each request 200 "ok", except one that arrives
    ``idle_s`` or more after its connection's last answer, which it closes the
    connection on; counts the connections it accepted."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.accepted = 0
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        loop = asyncio.get_running_loop()
        answered_at = loop.time()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if loop.time() - answered_at >= self.idle_s:
                    return  # its idle close and this request crossed
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
                answered_at = loop.time()
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the client closed or reset the connection: nothing left to answer
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def idle_closing_server(idle_s: float) -> AsyncIterator[IdleClosingServer]:
    state = IdleClosingServer(idle_s)
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    async with server:
        yield state


async def two_requests_with_a_pause(port: int, expiry_s: float) -> None:
    target = _target(f"http://127.0.0.1:{port}", "/v1/chat/completions", {})
    conn = _Connection("127.0.0.1", port, expiry_s=expiry_s)
    try:
        await _one(conn, target, b"{}", stream=False)
        await asyncio.sleep(PAUSE_S)
        await _one(conn, target, b"{}", stream=False)
    finally:
        conn.close()


async def test_a_connection_idle_past_its_expiry_is_opened_anew_and_the_request_answered() -> None:
    async with idle_closing_server(SERVER_IDLE_S) as server:
        await two_requests_with_a_pause(server.port, expiry_s=SERVER_IDLE_S / 2)
        assert server.accepted == 2


async def test_a_connection_kept_past_the_servers_idle_close_loses_the_request() -> None:
    # What the generator did before the expiry: the second request meets the
    # server's idle close and fails unanswered.
    async with idle_closing_server(SERVER_IDLE_S) as server:
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError, HttpError)):
            await two_requests_with_a_pause(server.port, expiry_s=60.0)
        assert server.accepted == 1


async def test_back_to_back_requests_keep_one_connection() -> None:
    async with idle_closing_server(idle_s=60.0) as server:
        target = _target(f"http://127.0.0.1:{server.port}", "/v1/chat/completions", {})
        conn = _Connection("127.0.0.1", server.port, expiry_s=60.0)
        try:
            for _ in range(3):
                await _one(conn, target, b"{}", stream=False)
        finally:
            conn.close()
        assert server.accepted == 1
