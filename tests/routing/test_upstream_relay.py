"""The relay releases its accounting and closes the upstream on every exit path.

These drive ``routing.upstream`` over an in-memory httpx transport whose body
stream records whether it was closed, which is what a replica observes as a
client disconnect.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from routing.core.leases import InflightLedger
from routing.core.sse import SseRelay
from routing.core.types import TargetState
from routing.upstream import (
    OUTCOME_CLIENT_CLOSED,
    OUTCOME_OK,
    OUTCOME_UPSTREAM_ERROR,
    RelayStream,
    UpstreamFailure,
    join_url,
    open_upstream,
)

pytestmark = pytest.mark.anyio

CONTENT = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1}}\n\n'


class UpstreamBody(httpx.AsyncByteStream):
    """A replica's response body: chunks, optionally a stall or a reset, and a close flag."""

    def __init__(self, chunks: list[bytes], *, stall: bool = False, reset: bool = False):
        self.chunks = chunks
        self.stall = stall
        self.reset = reset
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.reset:
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body"
            )
        if self.stall:
            await asyncio.Event().wait()  # a long generation, until cancelled

    async def aclose(self) -> None:
        self.closed = True


def _client(status: int, body: UpstreamBody) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, stream=body, headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


class Accounting:
    """What the dispatcher's finish hook does: release the lease, remember the outcome."""

    def __init__(self) -> None:
        self.ledger = InflightLedger()
        self.lease = self.ledger.acquire(TargetState("r", "http://r"), "req")
        self.outcomes: list[str] = []

    def finished(self, outcome: str, sse: SseRelay | None) -> None:
        self.outcomes.append(outcome)
        self.lease.release(ok=outcome == OUTCOME_OK)


async def _relay(body: UpstreamBody, acct: Accounting, *, strip: bool = True) -> RelayStream:
    client = _client(200, body)
    opened = await open_upstream(client, "http://r/v1/chat/completions", b"{}", {})
    return RelayStream(opened, sse=SseRelay(strip_usage=strip), on_finish=acct.finished)


async def test_complete_stream_is_relayed_with_usage_stripped_and_released_once() -> None:
    body, acct = UpstreamBody([CONTENT, CONTENT + USAGE, b"data: [DONE]\n\n"]), Accounting()
    stream = await _relay(body, acct)
    out = b"".join([chunk async for chunk in stream])
    assert out == CONTENT + CONTENT + b"data: [DONE]\n\n"
    assert acct.outcomes == [OUTCOME_OK] and acct.ledger.total == 0 and body.closed


async def test_client_disconnect_closes_the_upstream_and_releases() -> None:
    body, acct = UpstreamBody([CONTENT, CONTENT], stall=True), Accounting()
    iterator = aiter(await _relay(body, acct))
    assert await anext(iterator) == CONTENT
    await iterator.aclose()  # what aclosing() in Django's ASGI handler does
    assert acct.outcomes == [OUTCOME_CLIENT_CLOSED] and acct.ledger.total == 0 and body.closed


async def test_task_cancelled_while_waiting_for_upstream_releases() -> None:
    body, acct = UpstreamBody([CONTENT], stall=True), Accounting()
    stream = await _relay(body, acct)

    async def consume() -> None:
        async for _ in stream:
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.01)
    task.cancel()  # Django cancels the response task on http.disconnect
    with pytest.raises(asyncio.CancelledError):
        await task
    assert acct.outcomes == [OUTCOME_CLIENT_CLOSED] and acct.ledger.total == 0 and body.closed


async def test_a_body_dropped_without_being_iterated_still_releases() -> None:
    body, acct = UpstreamBody([CONTENT]), Accounting()
    stream = await _relay(body, acct)
    del stream
    gc.collect()
    await asyncio.sleep(0)  # the finalizer hands the cleanup to the loop
    await asyncio.sleep(0)
    assert acct.outcomes == [OUTCOME_CLIENT_CLOSED] and acct.ledger.total == 0 and body.closed


async def test_upstream_reset_mid_stream_ends_with_an_openai_error_event() -> None:
    body, acct = UpstreamBody([CONTENT], reset=True), Accounting()
    chunks = [chunk async for chunk in await _relay(body, acct)]
    assert chunks[0] == CONTENT
    event = json.loads(chunks[-1].removeprefix(b"data: "))
    assert event["error"]["type"] == "server_error"
    assert acct.outcomes == [OUTCOME_UPSTREAM_ERROR] and acct.ledger.total == 0


@pytest.mark.parametrize(("status", "capacity"), [(500, False), (503, False), (429, True)])
async def test_error_statuses_before_the_first_byte_are_retryable_failures(
    status: int, capacity: bool
) -> None:
    body = UpstreamBody([b'{"error": {"message": "busy"}}'])
    with pytest.raises(UpstreamFailure) as info:
        await open_upstream(_client(status, body), "http://r/x", b"{}", {})
    assert (info.value.status, info.value.capacity, info.value.marks_unhealthy) == (
        status,
        capacity,
        not capacity,
    )
    assert body.closed


async def test_empty_body_and_reset_before_first_byte_are_failures() -> None:
    for body in (UpstreamBody([]), UpstreamBody([], reset=True)):
        with pytest.raises(UpstreamFailure):
            await open_upstream(_client(200, body), "http://r/x", b"{}", {})
        assert body.closed


async def test_connect_error_is_a_failure() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    with pytest.raises(UpstreamFailure, match="ConnectError"):
        await open_upstream(client, "http://r/x", b"{}", {})


async def test_client_errors_are_relayed_not_retried() -> None:
    body = UpstreamBody([b'{"error": {"message": "max_tokens too large"}}'])
    opened = await open_upstream(_client(400, body), "http://r/x", b"{}", {})
    assert opened.status == 400
    assert b"max_tokens" in await opened.read_rest()


def test_join_url_tolerates_a_v1_base() -> None:
    assert join_url("http://r:1/", "/v1/completions") == "http://r:1/v1/completions"
    assert join_url("http://r:1/v1", "/v1/completions") == "http://r:1/v1/completions"
    assert join_url("http://r:1", "/metrics") == "http://r:1/metrics"
