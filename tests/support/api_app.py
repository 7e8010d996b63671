"""The ``/v1`` ASGI application in the test's own event loop, with a live runtime.

``serving_api`` builds what a balancer serves for ``/v1`` (the body limit in front of
``PlainApi`` for the inference routes and ``ApiASGIHandler`` for the rest) over a
real ``BalancerRuntime`` whose replicas are loopback servers (``Replicas``), and makes
the views reach that runtime.  ``Api.call`` sends one request as an ASGI server would
and checks what every answer must be: below 500, JSON unless a stream, and no slot
left taken.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings

from core.openai_request import Endpoint
from fleet.models import hash_api_key
from routing import runtime as runtime_module
from routing.api_asgi import ApiASGIHandler
from routing.api_plain import PlainApi
from routing.body_limit import BodyLimitMiddleware
from routing.runtime import BalancerRuntime
from tests.support.inprocess import runtime_for
from tests.support.loopback import Received, Reply
from tests.support.upstreams import OK_BODY, Upstreams

KEY = "mk-fuzz"
BODY_LIMIT = 1 << 16
AUTH = [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")]


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class Api:
    """The ``/v1`` ASGI application with a live runtime, driven from sync tests."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, runtime: BalancerRuntime, upstreams: Upstreams
    ) -> None:
        self.loop = loop
        self.runtime = runtime
        self.upstreams = upstreams
        self.app = BodyLimitMiddleware(PlainApi(ApiASGIHandler(), BODY_LIMIT), BODY_LIMIT)

    def call(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> Answer:
        answer = self.fetch(method, path, body, headers)
        self._check(answer)
        return answer

    def fetch(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> Answer:
        """One request, with no check on the answer (a non-JSON one, say ``/metrics``)."""
        return self.loop.run_until_complete(self._call(method, path, body, headers or []))

    async def _call(
        self, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Answer:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8", "surrogateescape"),
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        delivered = asyncio.Event()
        finished = asyncio.Event()
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if not delivered.is_set():
                delivered.set()
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()  # the client stays until the answer is complete
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finished.set()

        await self.app(scope, receive, send)
        start = sent[0]
        return Answer(
            start["status"],
            {name.lower(): value for name, value in start.get("headers", [])},
            b"".join(m.get("body", b"") for m in sent[1:]),
        )

    def _check(self, answer: Answer) -> None:
        assert answer.status < 500, answer.body[:300]
        if answer.headers.get(b"content-type", b"").startswith(b"text/event-stream"):
            assert answer.status == 200
        else:
            payload = json.loads(answer.body)
            assert isinstance(payload, dict)
            if answer.status >= 400:
                assert set(payload["error"]) >= {"message", "type", "param", "code"}
        # Every admitted request gave its slot back and nothing waits in a queue.
        assert self.runtime.inflight() == 0
        assert not any(self.runtime.queues.lengths().values())


STREAMING_PATHS = {e.path for e in Endpoint if e.streams}


class Replicas(Upstreams):
    """Replicas that stream only where vLLM does: other routes ignore ``stream``."""

    async def answer(self, request: Received) -> Reply:
        if request.method == "POST" and request.path not in STREAMING_PATHS:
            self.calls.append(request)
            return Reply(200, [json.dumps(OK_BODY).encode()])
        return await super().answer(request)


@contextmanager
def serving_api(behaviour: dict[str, str] | None = None, **config: Any) -> Iterator[Api]:
    """An ``Api`` over a runtime built with ``config`` (``BalancerConfig`` fields), its
    replicas ``a`` and ``b`` answering as ``behaviour`` says (``Upstreams``)."""
    loop = asyncio.new_event_loop()
    upstreams = Replicas(**(behaviour or {}))
    rt = loop.run_until_complete(runtime_for(upstreams, max_body_bytes=BODY_LIMIT, **config))
    assert rt.snapshot is not None
    rt.adopt(dataclasses.replace(rt.snapshot, api_key_hashes=frozenset({hash_api_key(KEY)})))

    async def started() -> BalancerRuntime:
        return rt

    # The runtime is built from a hand-set topology, not the database, so the views
    # reach this one instead of starting their own.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime_module, "_runtime", rt)
        patch.setattr(runtime_module, "get_runtime", started)
        patch.setattr(settings, "MERIDIAN_BALANCER", "lb-us")
        yield Api(loop, rt, upstreams)
    loop.run_until_complete(rt.close())
    loop.run_until_complete(upstreams.close())
    loop.run_until_complete(_finish_connections())
    loop.close()


async def _finish_connections() -> None:
    """Let the replicas' connection handlers see their sockets closed and end."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), 10)
