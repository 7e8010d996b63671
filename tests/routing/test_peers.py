"""The heartbeat balancers exchange: its JSON contract and Algorithm 1's τ rule."""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx
import pytest

from core.peers import Heartbeat, heartbeat_key
from core.topology import PeerSpec
from routing.peers import HttpReportFetch


def _beat(*, available: int = 1, queue: int = 0, queues: dict[str, int] | None = None) -> Heartbeat:
    return Heartbeat(
        balancer="near",
        region="eu",
        url="http://near",
        ts=100.0,
        healthy_replicas=2,
        available_replicas=available,
        inflight=0,
        queue=queue,
        models={"m": available},
        queues=queues or {},
    )


def test_heartbeat_round_trips_through_json() -> None:
    beat = _beat(queue=3, queues={"m": 3})
    assert Heartbeat.from_json(beat.to_json()) == beat
    assert heartbeat_key("b-us") == "meridian:balancer:b-us:heartbeat"


def test_a_heartbeat_without_per_model_queues_is_still_read() -> None:
    data = json.loads(_beat(queue=2).to_json())
    del data["queues"]
    beat = Heartbeat.from_json(json.dumps(data))
    assert beat.queues == {} and beat.queue_for("m") == 2


@pytest.mark.parametrize(
    "raw",
    [
        "[]",
        '{"balancer": "x"}',
        "not json",
        _beat().to_json().replace('"queues": {}', '"queues": 3'),
    ],
)
def test_malformed_heartbeats_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        Heartbeat.from_json(raw)


def test_available_needs_a_replica_and_a_queue_of_at_most_tau() -> None:
    assert _beat().available_for("m", queue_buffer=1)
    assert _beat(queue=1, queues={"m": 1}).available_for("m", queue_buffer=1)
    assert not _beat(queue=2, queues={"m": 2}).available_for("m", queue_buffer=1)
    assert not _beat(available=0).available_for("m", queue_buffer=1)
    assert not _beat().available_for("other", queue_buffer=1)
    # Another model's queue does not count against this one.
    assert _beat(queue=5, queues={"m": 0, "x": 5}).available_for("m", queue_buffer=1)


# -- fetching a peer's report over HTTP: bounded ------------------------------------------


async def _serve_once(head: bytes, body_chunks: list[bytes]) -> tuple[asyncio.Server, str]:
    """A loopback server that answers every GET with ``head`` then ``body_chunks``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head)
        with contextlib.suppress(ConnectionError):
            for chunk in body_chunks:
                writer.write(chunk)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _fetch(head: bytes, chunks: list[bytes], max_bytes: int) -> Heartbeat:
    server, url = await _serve_once(head, chunks)
    try:
        async with httpx.AsyncClient() as client:
            fetch = HttpReportFetch(client, token="t", timeout_s=5.0, max_bytes=max_bytes)
            return await fetch(PeerSpec("near", url, "eu"))
    finally:
        server.close()


@pytest.mark.anyio
async def test_a_report_within_the_limit_is_read() -> None:
    body = _beat().to_json().encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    assert await _fetch(head, [body], max_bytes=len(body)) == _beat()


@pytest.mark.anyio
async def test_a_report_declared_over_the_limit_is_refused_unread() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n"
    with pytest.raises(ValueError, match="100000000 bytes is over the 1024-byte limit"):
        await _fetch(head, [b"x" * 1024], max_bytes=1024)


@pytest.mark.anyio
async def test_an_undeclared_endless_report_is_cut_at_the_limit() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"%x\r\n%s\r\n" % (4096, b"{" * 4096)
    with pytest.raises(ValueError, match="over the 65536-byte limit"):
        await _fetch(head, [chunk] * 1000, max_bytes=65536)
