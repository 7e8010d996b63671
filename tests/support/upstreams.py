"""Replicas and peer balancers by name, each a loopback HTTP server answering as scripted.

An in-process balancer (``tests.support.inprocess``) points its topology at
these servers, so its production clients (the relay pool, the httpx probe and
poll client) really connect, send and read.  Behaviours, per name:

* ``ok`` (default): a chat completion, or an SSE stream when the body asks for
  one (with a usage chunk); ``X-Meridian-Replica: <name>-r`` on JSON answers;
* ``500``/``503``/``429``: that status with an OpenAI-style error body;
* ``reset``: the head, then the connection closes before the first body byte;
* ``refuse``: nothing listens on its port (connection refused);
* ``hold``: answers ``ok`` only once the test calls ``release(request_id)``;
* ``stall``/``cut``: a stream's first event, then nothing until the client leaves
  (``stall``) or the connection closes without ending the body (``cut``).

``GET /metrics`` shows ``running`` (default 1) and ``waiting`` (default 0) as
vLLM's gauges; other GETs are 404.  ``calls`` are the POSTs, in order.
"""

from __future__ import annotations

import asyncio
import json
import socket

from tests.support.balancers import MODEL
from tests.support.loopback import LoopbackServer, Received, Reply

__all__ = ["MODEL", "OK_BODY", "SSE", "Upstreams"]

OK_BODY = {
    "id": "x",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {
        "prompt_tokens": 20,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 16},
    },
}
SSE = [
    b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n',
    b'data: {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 1}}\n\n',
    b"data: [DONE]\n\n",
]


class Upstreams:
    def __init__(self, **behaviour: str) -> None:
        self.behaviour = behaviour
        self.calls: list[Received] = []
        self.running: dict[str, int] = {}  # what each replica's /metrics shows
        self.waiting: dict[str, int] = {}
        self._servers: dict[str, LoopbackServer] = {}
        self._urls: dict[str, str] = {}
        self._refusing: list[socket.socket] = []
        self._held: dict[str, asyncio.Event] = {}

    async def url(self, name: str) -> str:
        """The base URL ``name`` answers on (its server starts on first use)."""
        if name not in self._urls:
            self._urls[name] = await self._start(name)
        return self._urls[name]

    def hosts(self) -> list[str]:
        """Which upstreams the POSTs reached, in order."""
        return [call.server for call in self.calls]

    def release(self, request_id: str) -> None:
        """Let a ``hold`` upstream answer ``request_id``."""
        self._held.setdefault(request_id, asyncio.Event()).set()

    async def close(self) -> None:
        for server in self._servers.values():
            await server.close()
        for sock in self._refusing:
            sock.close()

    async def _start(self, name: str) -> str:
        if self.behaviour.get(name) == "refuse":
            # Bound but never listening: the kernel refuses every connection to it.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            self._refusing.append(sock)
            return f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = self._servers[name] = LoopbackServer(name, self.answer)
        return await server.start()

    async def answer(self, request: Received) -> Reply:
        """What ``request.server`` answers; subclasses script more paths."""
        name = request.server
        if request.method == "GET":
            if request.path != "/metrics":
                return Reply(404, [b"not found"], content_type="text/plain")
            running, waiting = self.running.get(name, 1), self.waiting.get(name, 0)
            text = f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
            return Reply(200, [text.encode()], content_type="text/plain")
        self.calls.append(request)
        mode = self.behaviour.get(name, "ok")
        if mode in {"500", "503", "429"}:
            return Reply(int(mode), [json.dumps({"error": {"message": mode}}).encode()])
        if mode == "reset":
            return Reply(200, reset=True)
        if mode == "hold":
            rid = request.headers["X-Request-ID"]
            await self._held.setdefault(rid, asyncio.Event()).wait()
        if json.loads(request.content).get("stream"):
            if mode in {"stall", "cut"}:
                return Reply(
                    200, SSE[:1], "text/event-stream", stall=mode == "stall", cut=mode == "cut"
                )
            return Reply(200, SSE, content_type="text/event-stream")
        replica = {"X-Meridian-Replica": f"{name}-r"}
        return Reply(200, [json.dumps(OK_BODY).encode()], headers=replica)
