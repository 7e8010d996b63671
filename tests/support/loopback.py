"""A scripted HTTP/1.1 server on a loopback port, for in-process balancer tests.

The balancer's own clients (the relay's ``UpstreamPool``, the shared httpx client
of probes and polls) talk to it over a real socket, so tests run the code that
production runs.  Each request is answered with the ``Reply`` the test's
``answer`` function returns: a status and body (sent chunked, chunk by chunk,
as a streaming replica does), or a misbehaviour a network produces:

* ``reset``: the head, then the connection closes before the first body byte;
* ``cut``: the chunks, then the connection closes without ending the body;
* ``stall``: the chunks, then nothing until the client goes away.

``interval_s`` spaces the chunks out, as an engine's tokens are.

The server records what an upstream would observe: each request, how many
connections were opened and how many are still open (a client that leaks a
connection never closes it), and whether a client left before a response ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus

import httpx


@dataclass(frozen=True)
class Reply:
    status: int = 200
    chunks: Sequence[bytes] = ()
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    reset: bool = False
    cut: bool = False
    stall: bool = False
    # Seconds between chunks (0: each chunk in its own read, back to back).
    interval_s: float = 0.0


@dataclass(frozen=True)
class Received:
    """One request as the upstream saw it; ``server`` is the name it plays."""

    server: str
    method: str
    path: str
    headers: httpx.Headers
    content: bytes


Answer = Callable[[Received], Reply | Awaitable[Reply]]


class LoopbackServer:
    def __init__(self, name: str, answer: Answer) -> None:
        self.name = name
        self.answer = answer
        self.requests: list[Received] = []
        self.connections = 0
        self.open_connections = 0
        # Set when a client closed its connection before a response had ended.
        self.client_left = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_connections += 1
        self._writers.add(writer)
        try:
            while (request := await _read_request(self.name, reader)) is not None:
                self.requests.append(request)
                reply = self.answer(request)
                if inspect.isawaitable(reply):
                    reply = await reply
                if not await self._respond(reader, writer, reply):
                    break
        except ConnectionError:
            self.client_left.set()
        finally:
            self.open_connections -= 1
            self._writers.discard(writer)
            writer.close()

    async def settled(self, timeout: float = 5.0) -> bool:
        """Whether every connection ends within ``timeout`` (a readiness wait: True at
        once when none is open); a connection a client never gave back stays open."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.open_connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        return self.open_connections == 0

    async def _respond(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: Reply
    ) -> bool:
        """Send ``reply``; False when the connection must end (a misbehaviour)."""
        status = f"{reply.status} {HTTPStatus(reply.status).phrase}"
        head = [f"HTTP/1.1 {status}", f"content-type: {reply.content_type}"]
        head += [f"{name}: {value}" for name, value in reply.headers.items()]
        head.append("transfer-encoding: chunked")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        if reply.reset:
            return False
        for chunk in reply.chunks:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            # One chunk per read, as a streaming replica sends them.
            await asyncio.sleep(reply.interval_s)
        if reply.cut:
            return False
        if reply.stall:
            if await reader.read() == b"":  # end of file: the client went away
                self.client_left.set()
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


async def _read_request(server: str, reader: asyncio.StreamReader) -> Received | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    fields = (line.partition(":") for line in lines if line)
    headers = httpx.Headers([(name.strip(), value.strip()) for name, _, value in fields])
    content = await reader.readexactly(int(headers.get("content-length", "0")))
    return Received(server, method, path, headers, content)


@contextlib.asynccontextmanager
async def serving(name: str, answer: Answer) -> AsyncIterator[tuple[LoopbackServer, str]]:
    """One server for the length of a ``with`` block: ``(server, base_url)``."""
    server = LoopbackServer(name, answer)
    url = await server.start()
    try:
        yield server, url
    finally:
        await server.close()
