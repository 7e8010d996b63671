"""The relay's keep-alive pool against a real loopback server it can misbehave on.

The server speaks just enough HTTP/1.1 to answer a POST with a chunked body and
records what an upstream would observe: how many connections were opened and
whether the client went away before the end of a response.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from routing.upstream import OUTCOME_CLIENT_CLOSED, RelayStream, open_upstream
from routing.upstream_pool import HIGH_WATER, UpstreamError, UpstreamPool, UpstreamTimeout

pytestmark = pytest.mark.anyio

EVENTS = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]


@dataclass
class FakeUpstream:
    """Behaviours: ``drop_second`` closes a reused connection instead of answering;
    ``stall`` sends the head and one chunk, then nothing (from the ``stall_from``-th
    request on a connection); ``pace`` seconds pass between events."""

    drop_second: bool = False
    stall: bool = False
    stall_from: int = 1
    pace: float = 0.0
    connections: int = 0
    disconnected_early: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            with contextlib.suppress(ConnectionError):  # the client left: nothing to answer
                while await _read_request(reader):
                    served += 1
                    if self.drop_second and served == 2:
                        break  # as if its keep-alive timer fired just as the request came in
                    await self._respond(
                        reader, writer, stall=self.stall and served >= self.stall_from
                    )
        finally:
            writer.close()

    async def _respond(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, stall: bool
    ) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n")
        for index, event in enumerate(EVENTS):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            if stall and index == 0:
                if await reader.read() == b"":  # end of file: the client went away
                    self.disconnected_early.set()
                return
            await asyncio.sleep(self.pace)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    await reader.readexactly(length)
    return True


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield fake, f"http://127.0.0.1:{port}/v1/chat/completions"
    server.close()


def _pool(read_timeout_s: float = 5.0) -> UpstreamPool:
    return UpstreamPool(connect_timeout_s=2.0, read_timeout_s=read_timeout_s)


async def test_streams_the_body_and_reuses_one_connection(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    pool = _pool()
    for _ in range(3):
        response = await pool.post(url, b"{}", {"Content-Type": "application/json"})
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        assert b"".join([chunk async for chunk in response.aiter_raw()]) == b"".join(EVENTS)
    assert fake.connections == 1
    await pool.aclose()


async def test_a_reused_connection_closed_by_the_server_is_retried_on_a_fresh_one(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    fake.drop_second = True
    pool = _pool()
    for _ in range(2):
        response = await pool.post(url, b"{}", {})
        assert await response.aread() == b"".join(EVENTS)
    assert fake.connections == 2
    await pool.aclose()


async def test_closing_mid_stream_disconnects_so_the_upstream_can_abort(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    fake.stall = True
    pool = _pool()
    opened = await open_upstream(pool, url, b"{}", {})
    assert opened.first_chunk == EVENTS[0]
    outcomes: list[str] = []
    stream = RelayStream(opened, sse=None, on_finish=lambda outcome, _: outcomes.append(outcome))
    relay = aiter(stream)
    assert await anext(relay) == EVENTS[0]
    await relay.aclose()  # what Django does when the client disconnects
    await asyncio.wait_for(fake.disconnected_early.wait(), 5)
    assert outcomes == [OUTCOME_CLIENT_CLOSED]
    await pool.aclose()


async def test_silence_past_the_read_timeout_and_refused_connections_are_upstream_errors(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    fake.stall = True
    pool = _pool(read_timeout_s=0.2)
    response = await pool.post(url, b"{}", {})
    with pytest.raises(UpstreamError, match="timed out") as timed_out:
        await response.aread()
    assert isinstance(timed_out.value, UpstreamTimeout)  # silence: busy or gone
    await response.aclose()
    with pytest.raises(UpstreamError, match="connect") as refused:
        await pool.post("http://127.0.0.1:9/", b"{}", {})
    assert not isinstance(refused.value, UpstreamTimeout)  # a refusal: nothing listens
    await pool.aclose()


async def test_the_read_timeout_bounds_each_silence_not_the_whole_response(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    fake.pace = 0.1  # three gaps: longer together than the timeout, each far shorter
    pool = _pool(read_timeout_s=0.25)
    for _ in range(2):  # the second on the connection the first left its timer on
        response = await pool.post(url, b"{}", {})
        assert await response.aread() == b"".join(EVENTS)
    assert fake.connections == 1
    await pool.aclose()


async def test_a_reused_connection_still_times_out_when_its_upstream_goes_silent(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    fake.stall, fake.stall_from = True, 2
    pool = _pool(read_timeout_s=0.3)
    first = await pool.post(url, b"{}", {})
    assert await first.aread() == b"".join(EVENTS)
    second = await pool.post(url, b"{}", {})
    with pytest.raises(UpstreamError, match="timed out"):
        await second.aread()
    await second.aclose()
    assert fake.connections == 1
    await pool.aclose()


async def test_warming_opens_idle_connections_that_a_burst_then_reuses(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    pool = _pool()
    assert await pool.warm(url, 4) == 4
    assert await pool.warm(url, 4) == 0  # already warm: nothing more to open
    responses = await asyncio.gather(*(pool.post(url, b"{}", {}) for _ in range(4)))
    bodies = await asyncio.gather(*(r.aread() for r in responses))
    assert bodies == [b"".join(EVENTS)] * 4
    assert fake.connections == 4  # the burst opened none of its own
    await pool.aclose()


async def test_warming_a_replica_that_refuses_opens_nothing() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    pool = _pool()
    assert await pool.warm(f"http://127.0.0.1:{port}/v1/completions", 3) == 0
    await pool.aclose()


@dataclass
class MetricsPage:
    """Answers each GET with ``status`` and ``body`` (``Content-Length`` framed), or
    with nothing at all once ``stall`` is set."""

    body: bytes
    status: int = 200
    stall: bool = False
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            # The client closed its connection: nothing more to answer.
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    self.requests.append(head)
                    if self.stall:
                        await reader.read()
                        break
                    writer.write(
                        b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n"
                        % (self.status, len(self.body))
                    )
                    writer.write(self.body)
                    await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def page() -> AsyncIterator[tuple[MetricsPage, str]]:
    # Larger than HIGH_WATER: reading pauses unless the body is taken as it comes.
    fake = MetricsPage(b"vllm:num_requests_running 1\n" * 20_000)
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield fake, f"http://127.0.0.1:{port}/metrics"
    server.close()


async def test_get_reads_a_whole_body_past_the_high_water_mark_on_one_connection(
    page: tuple[MetricsPage, str],
) -> None:
    fake, url = page
    assert len(fake.body) > HIGH_WATER
    pool = _pool()
    for _ in range(2):
        assert await pool.get(url, 2.0) == (200, fake.body)
    assert fake.connections == 1
    assert fake.requests[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"content-length" not in fake.requests[0].lower()
    fake.status, fake.body = 503, b"busy"
    assert await pool.get(url, 2.0) == (503, b"busy")
    await pool.aclose()


async def test_get_applies_its_own_timeout_not_the_pools(
    page: tuple[MetricsPage, str],
) -> None:
    fake, url = page
    fake.stall = True
    pool = _pool(read_timeout_s=60.0)
    with pytest.raises(UpstreamError, match="timed out"):
        await pool.get(url, 0.2)
    with pytest.raises(UpstreamError, match="connect"):
        await pool.get("http://127.0.0.1:9/metrics", 0.2)
    await pool.aclose()


async def test_a_body_that_ends_where_the_server_closes_is_read_whole() -> None:
    """An HTTP/1.0-style answer (no Content-Length, no chunks) ends at the close, as
    httpx read it; a reset in the middle of a framed body is still a failure."""
    bodies = {b"/close": b"vllm:num_requests_running 1\n", b"/cut": b"vllm:num"}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ")[1]
        if path == b"/close":
            writer.write(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\n" + bodies[path])
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + bodies[path])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pool = _pool()
    assert await pool.get(f"{base}/close", 2.0) == (200, bodies[b"/close"])
    with pytest.raises(UpstreamError, match="closed"):
        await pool.get(f"{base}/cut", 2.0)
    await pool.aclose()
    server.close()


class _Collect:
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.ended = asyncio.Event()

    def body(self, data: bytes) -> None:
        self.parts.append(data)

    def end(self, error: BaseException | None, rest: bytes) -> None:
        self.parts.append(rest)
        self.ended.set()


async def test_heard_from_is_the_last_byte_of_a_relayed_answer_not_a_probe_page(
    upstream: tuple[FakeUpstream, str], page: tuple[MetricsPage, str]
) -> None:
    """The prober's sign of life: a busy replica's ``/metrics`` may time out while
    its streams still flow, and only the streams say it is alive."""
    fake, url = upstream
    _, metrics_url = page
    pool = _pool()
    assert await pool.get(metrics_url, 2.0) == (200, page[0].body)
    assert pool.heard_from(metrics_url) is None  # a page read is no relayed answer
    assert pool.heard_from(url) is None  # nothing relayed yet

    fake.pace = 0.1  # the events and the body's end come apart
    response = await pool.post(url, b"{}", {})
    at_head = pool.heard_from(url)
    assert at_head is not None
    sink = _Collect()
    response.stream_to(sink)
    await sink.ended.wait()
    assert b"".join(sink.parts) == b"".join(EVENTS)
    at_end = pool.heard_from(url)
    assert at_end is not None and at_end > at_head  # the reads after the head moved it
    await response.aclose()
    await pool.aclose()
