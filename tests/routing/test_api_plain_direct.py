"""A stream relayed straight to the client's connection (``DirectBody``) over real uvicorn.

The plain ``/v1`` path writes a relayed stream through the balancer's own HTTP
protocol (``routing.http_protocol.GuardedHttpToolsProtocol``) instead of one ASGI
message per read.  Here the same application runs under uvicorn with that protocol
on loopback, and a raw HTTP/1.1 client reads what a client would: the bytes of the
ASGI path, a connection that stays usable after a stream, an upstream failure
ending the stream with an error event, and a client that leaves mid-stream giving
its slot back.  Waits are bounded only to catch a hang; nothing asserts speed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import uvicorn

from routing.http_protocol import GuardedHttpToolsProtocol
from tests.support.api_app import AUTH, Api, serving_api
from tests.support.balancers import MODEL
from tests.support.upstreams import SSE

T = TypeVar("T")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": True}
HANG = 10.0


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with serving_api(auth_failure_limit=1 << 30) as served:
        yield served


def _over_uvicorn(api: Api, scenario: Callable[[int], Awaitable[T]]) -> T:
    """``scenario(port)`` while uvicorn serves ``api.app`` with the balancer's protocol."""

    async def run() -> T:
        config = uvicorn.Config(
            api.app,
            host="127.0.0.1",
            port=0,
            http=GuardedHttpToolsProtocol,
            lifespan="off",
            log_level="error",
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            return await asyncio.wait_for(
                scenario(server.servers[0].sockets[0].getsockname()[1]), HANG
            )
        finally:
            server.should_exit = True
            await task

    return api.loop.run_until_complete(run())


def _request(rid: str) -> bytes:
    body = json.dumps(CHAT).encode()
    head = [b"POST /v1/chat/completions HTTP/1.1", b"host: lb", b"x-request-id: " + rid.encode()]
    head += [name + b": " + value for name, value in AUTH]
    head.append(b"content-length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status, headers and the de-chunked body of one chunked response."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = dict(line.split(b": ", 1) for line in lines[1:] if line)
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += (await reader.readexactly(size + 2))[:-2]
    assert await reader.readexactly(2) == b"\r\n"
    return int(lines[0].split()[1]), headers, body


def test_streams_are_written_as_the_asgi_path_sends_them_on_a_kept_alive_connection(
    api: Api,
) -> None:
    requests = api.runtime.metrics.requests
    before = requests.value(MODEL, "200", "local")

    async def scenario(port: int) -> list[tuple[int, dict[bytes, bytes], bytes]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        for rid in ("rid-direct-1", "rid-direct-2"):  # the second on the same connection
            writer.write(_request(rid))
            answers.append(await _response(reader))
        writer.close()
        return answers

    for status, headers, body in _over_uvicorn(api, scenario):
        assert status == 200 and headers[b"transfer-encoding"] == b"chunked"
        assert headers[b"content-type"].startswith(b"text/event-stream")
        assert body == SSE[0] + SSE[2]  # the usage event stripped: the client did not ask
    assert requests.value(MODEL, "200", "local") == before + 2
    assert api.runtime.inflight() == 0


def _with_replicas(behaviour: str) -> Any:
    return serving_api({"a": behaviour, "b": behaviour}, auth_failure_limit=1 << 30)


def test_an_upstream_cut_mid_stream_ends_it_with_an_error_event() -> None:
    with _with_replicas("cut") as api:

        async def scenario(port: int) -> tuple[int, dict[bytes, bytes], bytes]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request("rid-cut"))
            answer = await _response(reader)
            writer.close()
            return answer

        status, _, body = _over_uvicorn(api, scenario)
        assert status == 200 and body.startswith(SSE[0])
        event = json.loads(body.removeprefix(SSE[0]).removeprefix(b"data: "))
        assert event["error"]["type"] == "server_error"
        assert api.runtime.inflight() == 0


def test_a_client_gone_mid_stream_gives_its_slot_back_and_is_counted_closed() -> None:
    with _with_replicas("stall") as api:
        requests = api.runtime.metrics.requests

        async def scenario(port: int) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request("rid-gone"))
            await reader.readuntil(b"\r\n\r\n")
            await reader.readuntil(SSE[0])  # the first event reached the client
            writer.close()
            while api.runtime.inflight():
                await asyncio.sleep(0.01)

        _over_uvicorn(api, scenario)
        assert api.runtime.inflight() == 0
        assert requests.value(MODEL, "499", "local") == 1


def test_a_non_streamed_answer_is_written_whole_on_a_kept_alive_connection(api: Api) -> None:
    requests = api.runtime.metrics.requests
    before = requests.value(MODEL, "200", "local")
    body = json.dumps({**CHAT, "stream": False}).encode()

    async def scenario(port: int) -> list[tuple[bytes, bytes]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        for rid in ("rid-whole-1", "rid-whole-2"):  # the second on the same connection
            head = [
                b"POST /v1/chat/completions HTTP/1.1",
                b"host: lb",
                b"x-request-id: " + rid.encode(),
            ]
            head += [name + b": " + value for name, value in AUTH]
            head.append(b"content-length: %d" % len(body))
            writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
            got = await reader.readuntil(b"\r\n\r\n")
            length = int(got.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            answers.append((got, await reader.readexactly(length)))
        writer.close()
        return answers

    for head, payload in _over_uvicorn(api, scenario):
        assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head
        assert b"content-type: application/json" in head
        assert json.loads(payload)["object"] == "chat.completion"
    assert requests.value(MODEL, "200", "local") == before + 2
    assert api.runtime.inflight() == 0
