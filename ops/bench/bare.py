"""The bare proxy of ``manage.py bench proxy --bare``: the balancer's server and
upstream pool with nothing of Meridian between them.

It runs under the same uvicorn and httptools as a balancer and relays through the
same ``UpstreamPool``, round-robin over the backends, and does nothing else: no
authentication, no parsing of the request, no tokens, no policy, no accounting, no
metrics.  What it costs per request is what any proxy built on these parts costs;
a balancer's CPU above it is Meridian's own work (docs/performance.md).  A bench
row, never a router: it answers every path with whatever a backend answers.

Started by ``running_bare`` as its own process, the backends in
``MERIDIAN_BARE_BACKENDS`` (comma-separated base URLs).  It answers ``/health``
itself, so the bench can wait for it as for the other routers.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ops.bench.peers import HOST, RunningPeer, free_port, stop, wait_ready
from routing.asgi_types import Receive, Scope, Send
from routing.upstream_pool import UpstreamError, UpstreamPool

BACKENDS_ENV = "MERIDIAN_BARE_BACKENDS"
NAME = "bare"
_FORWARDED = ("content-type", "authorization")


class BareProxy:
    """An ASGI app relaying each request to the next backend in turn."""

    def __init__(self, backends: list[str]) -> None:
        if not backends:
            raise ValueError(f"no backends: set {BACKENDS_ENV}")
        self._next = itertools.cycle([b.rstrip("/") for b in backends]).__next__
        self._pool: UpstreamPool | None = None  # made on the server's loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await _answer(send, 200, b"application/json", b'{"status": "ok"}')
            return
        body = await _body(receive)
        if self._pool is None:
            self._pool = UpstreamPool(connect_timeout_s=10.0, read_timeout_s=300.0)
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name.decode("latin-1") in _FORWARDED
        }
        try:
            response = await self._pool.post(self._next() + scope["path"], body, headers)
        except UpstreamError as exc:
            await _answer(send, 502, b"text/plain", str(exc).encode())
            return
        content_type = (response.headers.get("content-type") or "").encode("latin-1")
        try:
            if content_type.startswith(b"text/event-stream"):
                await _relay(send, response.status_code, content_type, response.aiter_raw())
            else:
                await _answer(send, response.status_code, content_type, await response.aread())
        finally:
            await response.aclose()


async def _body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _answer(send: Send, status: int, content_type: bytes, body: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _relay(send: Send, status: int, content_type: bytes, chunks: Any) -> None:
    headers = [(b"content-type", content_type)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def app_from_env() -> BareProxy:
    return BareProxy([b for b in os.environ.get(BACKENDS_ENV, "").split(",") if b])


def argv(port: int, host: str = HOST) -> list[str]:
    """uvicorn as the balancer runs it (httptools, its own best loop, no access log)."""
    return [
        sys.executable, "-m", "uvicorn", "--host", host, "--port", str(port),
        "--lifespan", "off", "--http", "httptools", "--no-access-log",
        "--log-level", "warning", "--factory", "ops.bench.bare:app_from_env",
    ]  # fmt: skip


@contextlib.contextmanager
def running_bare(backends: list[str], log_dir: Path) -> Iterator[RunningPeer]:
    """The bare proxy in front of ``backends``, answering, and stopped on exit."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, BACKENDS_ENV: ",".join(backends)}
    with open(log_dir / f"{NAME}.log", "wb") as log:
        process = subprocess.Popen(
            argv(port), stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=Path(__file__).resolve().parents[2], start_new_session=True,
        )  # fmt: skip
    try:
        peer = RunningPeer(NAME, f"http://{HOST}:{port}", process)
        wait_ready(peer, log_dir / f"{NAME}.log")
        yield peer
    finally:
        stop(process)
