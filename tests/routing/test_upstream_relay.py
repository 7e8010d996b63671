"""The relay releases its accounting and closes the upstream on every exit path.

These drive ``routing.upstream`` through the relay's pool against a loopback
replica (``tests.support.loopback``) that records what a replica observes: a
client that went away mid-response, and connections never given back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from core.leases import InflightLedger
from core.sse import SseRelay
from core.types import TargetState
from routing.asgi_types import Message, Send
from routing.upstream import (
    OUTCOME_CLIENT_CLOSED,
    OUTCOME_OK,
    OUTCOME_UPSTREAM_ERROR,
    RelayStream,
    UpstreamFailure,
    join_url,
    open_upstream,
)
from routing.upstream_pool import UpstreamPool
from tests.support.loopback import LoopbackServer, Reply, serving

pytestmark = pytest.mark.anyio

CONTENT = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1}}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    pool = UpstreamPool(connect_timeout_s=2.0, read_timeout_s=5.0)
    yield pool
    await pool.aclose()


@contextlib.asynccontextmanager
async def upstream(reply: Reply) -> AsyncIterator[tuple[LoopbackServer, str]]:
    """A replica answering every request with ``reply``; its URL."""
    async with serving("r", lambda request: reply) as (server, base):
        yield server, f"{base}/v1/chat/completions"


async def closed(server: LoopbackServer, pool: UpstreamPool) -> bool:
    """Nothing held on to the upstream's connection: once the pool closes its idle
    ones, every connection ends (one the relay leaked would stay open)."""
    await pool.aclose()
    return await server.settled()


class Accounting:
    """What the dispatcher's finish hook does: release the lease, remember the outcome."""

    def __init__(self) -> None:
        self.ledger = InflightLedger()
        self.lease = self.ledger.acquire(TargetState("r", "http://r"), "req")
        self.outcomes: list[str] = []

    def finished(self, outcome: str, sse: SseRelay | None) -> None:
        self.outcomes.append(outcome)
        self.lease.release(ok=outcome == OUTCOME_OK)


async def _relay(pool: UpstreamPool, url: str, acct: Accounting) -> RelayStream:
    opened = await open_upstream(pool, url, b"{}", {})
    return RelayStream(opened, sse=SseRelay(strip_usage=True), on_finish=acct.finished)


async def test_complete_stream_is_relayed_with_usage_stripped_and_released_once(
    pool: UpstreamPool,
) -> None:
    acct = Accounting()
    async with upstream(Reply(chunks=[CONTENT, CONTENT + USAGE, DONE])) as (server, url):
        stream = await _relay(pool, url, acct)
        out = b"".join([chunk async for chunk in stream])
        assert out == CONTENT + CONTENT + DONE
        assert acct.outcomes == [OUTCOME_OK] and acct.ledger.total == 0
        assert await closed(server, pool)


async def test_client_disconnect_closes_the_upstream_and_releases(pool: UpstreamPool) -> None:
    acct = Accounting()
    async with upstream(Reply(chunks=[CONTENT], stall=True)) as (server, url):
        iterator = aiter(await _relay(pool, url, acct))
        assert await anext(iterator) == CONTENT
        await iterator.aclose()  # what aclosing() in Django's ASGI handler does
        assert acct.outcomes == [OUTCOME_CLIENT_CLOSED] and acct.ledger.total == 0
        await asyncio.wait_for(server.client_left.wait(), 5)
        assert await closed(server, pool)


async def test_task_cancelled_while_waiting_for_upstream_releases(pool: UpstreamPool) -> None:
    acct = Accounting()
    async with upstream(Reply(chunks=[CONTENT], stall=True)) as (server, url):
        stream = await _relay(pool, url, acct)

        async def consume() -> None:
            async for _ in stream:
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.01)
        task.cancel()  # Django cancels the response task on http.disconnect
        with pytest.raises(asyncio.CancelledError):
            await task
        assert acct.outcomes == [OUTCOME_CLIENT_CLOSED] and acct.ledger.total == 0
        await asyncio.wait_for(server.client_left.wait(), 5)
        assert await closed(server, pool)


async def test_a_body_dropped_without_being_iterated_still_releases(pool: UpstreamPool) -> None:
    acct = Accounting()
    async with upstream(Reply(chunks=[CONTENT], stall=True)) as (server, url):
        stream = await _relay(pool, url, acct)
        del stream
        gc.collect()
        await asyncio.sleep(0)  # the finalizer hands the cleanup to the loop
        await asyncio.sleep(0)
        assert acct.outcomes == [OUTCOME_CLIENT_CLOSED] and acct.ledger.total == 0
        await asyncio.wait_for(server.client_left.wait(), 5)
        assert await closed(server, pool)


async def test_upstream_reset_mid_stream_ends_with_an_openai_error_event(
    pool: UpstreamPool,
) -> None:
    acct = Accounting()
    async with upstream(Reply(chunks=[CONTENT], cut=True)) as (_, url):
        chunks = [chunk async for chunk in await _relay(pool, url, acct)]
    assert chunks[0] == CONTENT
    event = json.loads(chunks[-1].removeprefix(b"data: "))
    assert event["error"]["type"] == "server_error"
    assert acct.outcomes == [OUTCOME_UPSTREAM_ERROR] and acct.ledger.total == 0


@pytest.mark.parametrize(("status", "capacity"), [(500, False), (503, False), (429, True)])
async def test_error_statuses_before_the_first_byte_are_retryable_failures(
    pool: UpstreamPool, status: int, capacity: bool
) -> None:
    async with upstream(Reply(status, [b'{"error": {"message": "busy"}}'])) as (server, url):
        with pytest.raises(UpstreamFailure) as info:
            await open_upstream(pool, url, b"{}", {})
        assert (info.value.status, info.value.capacity, info.value.marks_unhealthy) == (
            status,
            capacity,
            not capacity,
        )
        assert await closed(server, pool)


async def test_empty_body_and_reset_before_first_byte_are_failures(pool: UpstreamPool) -> None:
    for reply in (Reply(200, []), Reply(200, [CONTENT], reset=True)):
        async with upstream(reply) as (server, url):
            with pytest.raises(UpstreamFailure):
                await open_upstream(pool, url, b"{}", {})
            assert await closed(server, pool)


async def test_connect_error_is_a_failure(pool: UpstreamPool) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/x"
        with pytest.raises(UpstreamFailure, match="connect"):
            await open_upstream(pool, url, b"{}", {})


async def test_client_errors_are_relayed_not_retried(pool: UpstreamPool) -> None:
    reply = Reply(400, [b'{"error": {"message": "max_tokens too large"}}'])
    async with upstream(reply) as (_, url):
        opened = await open_upstream(pool, url, b"{}", {})
        assert opened.status == 400
        assert b"max_tokens" in await opened.read_rest()


def test_join_url_tolerates_a_v1_base() -> None:
    assert join_url("http://r:1/", "/v1/completions") == "http://r:1/v1/completions"
    assert join_url("http://r:1/v1", "/v1/completions") == "http://r:1/v1/completions"
    assert join_url("http://r:1", "/metrics") == "http://r:1/metrics"


class Client:
    """A ``BodyWriter`` playing the client's connection: what was written, and a full
    buffer (``full``) that pauses the relay's upstream until ``drain``."""

    def __init__(self, *, full: bool = False) -> None:
        self.writes: list[bytes] = []
        self.ends: list[bytes] = []
        self.full = full
        self._resume: Callable[[], None] | None = None

    async def start(self, send: Send, message: Message) -> None:
        await send(message)

    def usable(self) -> bool:
        return not self.ends

    def write(self, data: bytes) -> None:
        if data:  # nothing to send but a head (which this client has no use for)
            self.writes.append(data)

    def finish(self, data: bytes) -> None:
        self.ends.append(data)

    def hold(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        self._resume = resume
        if self.full:
            pause()

    def release(self) -> None:
        self._resume = None

    def drain(self) -> None:
        self.full = False
        if self._resume is not None:
            self._resume()

    def body(self) -> bytes:
        return b"".join(self.writes + self.ends)


async def test_a_relay_written_to_its_client_sends_what_the_iterator_yields(
    pool: UpstreamPool,
) -> None:
    acct = Accounting()
    client = Client()
    async with upstream(Reply(chunks=[CONTENT, CONTENT + USAGE, DONE])) as (server, url):
        await (await _relay(pool, url, acct)).relay_to(client)
        assert client.body() == CONTENT + CONTENT + DONE
        assert len(client.ends) == 1  # the body's end, written once
        assert acct.outcomes == [OUTCOME_OK] and acct.ledger.total == 0
        assert await closed(server, pool)


async def test_a_relay_written_to_its_client_ends_a_cut_stream_with_an_error_event(
    pool: UpstreamPool,
) -> None:
    acct = Accounting()
    client = Client()
    async with upstream(Reply(chunks=[CONTENT], cut=True)) as (_, url):
        await (await _relay(pool, url, acct)).relay_to(client)
    assert client.body().startswith(CONTENT)
    event = json.loads(client.ends[0].removeprefix(CONTENT).removeprefix(b"data: "))
    assert event["error"]["type"] == "server_error"
    assert acct.outcomes == [OUTCOME_UPSTREAM_ERROR] and acct.ledger.total == 0


async def test_a_client_that_cannot_take_more_holds_the_upstream_back() -> None:
    pool = UpstreamPool(connect_timeout_s=2.0, read_timeout_s=0.2)
    acct = Accounting()
    client = Client(full=True)
    async with upstream(Reply(chunks=[CONTENT] * 200 + [DONE])) as (server, url):
        relay = asyncio.create_task((await _relay(pool, url, acct)).relay_to(client))
        await asyncio.sleep(0.5)  # past the read timeout: a held-back upstream is no stall
        # Only what came with the first byte was written; the rest waits upstream.
        assert len(client.writes) == 1 and not client.ends and not relay.done()
        client.drain()
        await asyncio.wait_for(relay, 5)
        assert client.body() == CONTENT * 200 + DONE
        assert acct.outcomes == [OUTCOME_OK] and acct.ledger.total == 0
        assert await closed(server, pool)


async def test_an_upstream_silent_past_the_read_timeout_ends_a_written_relay() -> None:
    pool = UpstreamPool(connect_timeout_s=2.0, read_timeout_s=0.2)
    acct = Accounting()
    client = Client()
    async with upstream(Reply(chunks=[CONTENT], stall=True)) as (server, url):
        await asyncio.wait_for((await _relay(pool, url, acct)).relay_to(client), 5)
        assert b"read timed out" in client.ends[0]
        assert acct.outcomes == [OUTCOME_UPSTREAM_ERROR] and acct.ledger.total == 0
        await asyncio.wait_for(server.client_left.wait(), 5)
        assert await closed(server, pool)


async def test_a_written_relay_cancelled_when_its_client_leaves_closes_the_upstream(
    pool: UpstreamPool,
) -> None:
    acct = Accounting()
    client = Client()
    async with upstream(Reply(chunks=[CONTENT], stall=True)) as (server, url):
        relay = asyncio.create_task((await _relay(pool, url, acct)).relay_to(client))
        while not client.writes:
            await asyncio.sleep(0.01)
        relay.cancel()  # what the plain path does when the client's connection drops
        with pytest.raises(asyncio.CancelledError):
            await relay
        assert client.ends == []
        assert acct.outcomes == [OUTCOME_CLIENT_CLOSED] and acct.ledger.total == 0
        await asyncio.wait_for(server.client_left.wait(), 5)
        assert await closed(server, pool)
