"""Plumbing shared by the emulated replica's handlers: ASGI bodies, disconnects and
responses (plain ASGI, as uvicorn runs it), and the engine driver they submit to.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from sim.engine import EngineRequest, RequestOutput

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Driver(Protocol):
    """What a handler needs of ``sim.replica.EngineDriver``."""

    def submit(self, request: EngineRequest) -> asyncio.Queue[RequestOutput]: ...

    def abort(self, request_id: str) -> None: ...


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if the client left before sending it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def until_disconnect(receive: Receive, work: Coroutine[Any, Any, Any]) -> bool:
    """Run ``work`` until it ends or the client disconnects; True if it ended first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()  # re-raise a failure of the work itself
    return True


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def start(status: int, content_type: str, length: int | None = None) -> dict[str, Any]:
    headers = [(b"content-type", content_type.encode())]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": status, "headers": headers}


async def send_bytes(send: Send, status: int, body: bytes, content_type: str) -> None:
    await send(start(status, content_type, len(body)))
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    await send_bytes(send, status, json.dumps(payload).encode(), "application/json")


async def send_sse(send: Send, payload: dict[str, Any]) -> None:
    data = b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def drain(queue: asyncio.Queue[RequestOutput]) -> list[RequestOutput]:
    """Wait for one output, then take every other one already queued (coalesced chunks)."""
    outputs = [await queue.get()]
    while not queue.empty():
        outputs.append(queue.get_nowait())
    return outputs
