"""Fuzzing the ``/v1`` API in process: whatever a client sends, never a 500.

The ASGI application a balancer serves for ``/v1`` (the body limit in front of
``ApiASGIHandler``) is called in this test's own event loop, with a real
``BalancerRuntime`` behind it whose replicas are loopback servers that answer every
request (``tests.support.upstreams``), so a request the balancer admits really is
dispatched, relayed and settled.  Hypothesis generates the requests: well-formed
ones with hostile values (lone surrogates, huge or negative token ids, wrong
types, deep nesting), raw bytes, odd headers and content types, unknown paths and
methods.  After each one: the status is below 500, every answer that is not a
stream is an OpenAI-shaped JSON body, and no slot is left taken.

Derandomized (the same examples on every run), without deadlines: the suite must
neither flake nor depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.models import hash_api_key
from routing import runtime as runtime_module
from routing.api_asgi import ApiASGIHandler
from routing.body_limit import BodyLimitMiddleware
from routing.core.openai_request import Endpoint
from routing.runtime import BalancerRuntime
from tests.support.balancers import MODEL
from tests.support.inprocess import runtime_for
from tests.support.loopback import Received, Reply
from tests.support.upstreams import OK_BODY, Upstreams

KEY = "mk-fuzz"
BODY_LIMIT = 1 << 16
FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclasses.dataclass
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class Api:
    """The ``/v1`` ASGI application with a live runtime, driven from sync tests."""

    def __init__(self, loop: asyncio.AbstractEventLoop, runtime: BalancerRuntime) -> None:
        self.loop = loop
        self.runtime = runtime
        self.app = BodyLimitMiddleware(ApiASGIHandler(), BODY_LIMIT)

    def call(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> Answer:
        answer = self.loop.run_until_complete(self._call(method, path, body, headers or []))
        self._check(answer)
        return answer

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


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    loop = asyncio.new_event_loop()
    upstreams = Replicas()
    rt = loop.run_until_complete(runtime_for(upstreams, max_body_bytes=BODY_LIMIT))
    assert rt.snapshot is not None
    rt.adopt(dataclasses.replace(rt.snapshot, api_key_hashes=frozenset({hash_api_key(KEY)})))

    async def started() -> BalancerRuntime:
        return rt

    # The runtime is built from a hand-set topology, not the database, so the views
    # reach this one instead of starting their own.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime_module, "_runtime", rt)
        patch.setattr(runtime_module, "get_runtime", started)
        from django.conf import settings as django_settings

        patch.setattr(django_settings, "MERIDIAN_BALANCER", "lb-us")
        yield Api(loop, rt)
    loop.run_until_complete(rt.close())
    loop.run_until_complete(upstreams.close())
    loop.run_until_complete(_finish_connections())
    loop.close()


async def _finish_connections() -> None:
    """Let the replicas' connection handlers see their sockets closed and end."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), 10)


AUTH = [(b"authorization", f"Bearer {KEY}".encode()), (b"content-type", b"application/json")]

# Text as a hostile client sends it: any code point, lone surrogates included.
any_text = st.text(st.characters(codec=None, categories=None), max_size=40)
token_ids = st.lists(st.integers(min_value=-(1 << 70), max_value=1 << 70), max_size=40)
json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | any_text
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=20,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | json_value},
    optional={"content": any_text | json_value},
)
prompt_field = any_text | token_ids | st.lists(any_text, max_size=3) | json_value
FIELDS: dict[Endpoint, dict[str, st.SearchStrategy[Any]]] = {
    Endpoint.CHAT: {"messages": st.lists(message, max_size=3) | json_value},
    Endpoint.COMPLETIONS: {"prompt": prompt_field},
    Endpoint.EMBEDDINGS: {"input": prompt_field | st.lists(message, max_size=2)},
    Endpoint.RESPONSES: {"input": prompt_field | st.lists(message, max_size=2)},
    Endpoint.SCORE: {"text_1": any_text, "text_2": any_text | json_value},
    Endpoint.RERANK: {"query": any_text, "documents": json_value},
}
COMMON: dict[str, st.SearchStrategy[Any]] = {
    "stream": st.booleans() | json_value,
    "max_tokens": st.integers() | json_value,
    "max_completion_tokens": st.integers(),
    "max_output_tokens": st.integers(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": json_value})
    | json_value,
    "user": any_text | json_value,
    "add_special_tokens": st.booleans() | json_value,
    "chat_template_kwargs": json_value,
    "tools": json_value,
}


def request_body(endpoint: Endpoint) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"model": st.just(MODEL) | st.just(MODEL) | any_text | json_value},
        optional={**FIELDS[endpoint], **COMMON},
    )


def encode(body: dict[str, Any]) -> bytes:
    # ensure_ascii keeps lone surrogates as \ud800 escapes, as a client's JSON would.
    return json.dumps(body).encode()


@pytest.mark.parametrize("endpoint", list(Endpoint), ids=lambda e: e.name.lower())
def test_well_formed_json_with_hostile_values_is_never_a_500(api: Api, endpoint: Endpoint) -> None:
    @settings(FUZZ, max_examples=250)
    @given(body=request_body(endpoint))
    def fuzz(body: dict[str, Any]) -> None:
        api.call("POST", endpoint.path, encode(body), AUTH)

    fuzz()


nested = st.integers(min_value=1, max_value=5000).map(
    lambda depth: (
        b'{"model": "%s", "prompt": "x", "extra": %s%s}'
        % (MODEL.encode(), b"[" * depth, b"]" * depth)
    )
)
raw_bodies = (
    st.binary(max_size=300)
    | nested
    | st.sampled_from(
        [
            b'{"model": "%s", "prompt": "\\ud800"}' % MODEL.encode(),
            b'{"model": "%s", "prompt": [-1], "max_tokens": 2}' % MODEL.encode(),
            b'{"model": "%s", "prompt": [4294967296]}' % MODEL.encode(),
            b'{"model": "%s", "prompt": 1e999}' % MODEL.encode(),
            b'{"model": "%s", "prompt": "x", "max_tokens": 1e400}' % MODEL.encode(),
            b'{"model": "%s", "prompt": "' % MODEL.encode() + b"x" * (BODY_LIMIT + 1) + b'"}',
            '{"model": "m", "prompt": "é"}'.encode("utf-16"),
            b"\xef\xbb\xbf{}",
            b"[]",
            b"null",
        ]
    )
)


@settings(FUZZ, max_examples=400)
@given(endpoint=st.sampled_from(list(Endpoint)), body=raw_bodies)
def test_any_bytes_as_a_body_are_never_a_500(api: Api, endpoint: Endpoint, body: bytes) -> None:
    api.call("POST", endpoint.path, body, AUTH)


header_value = st.binary(max_size=200) | st.sampled_from(
    [b"x" * 70_000, b"-5", b"99999999999999999999", b"\xff\xfe", b""]
)
header_name = st.sampled_from(
    [
        b"content-type",
        b"content-length",
        b"authorization",
        b"x-request-id",
        b"x-session-id",
        b"x-meridian-forwarded-from",
        b"accept",
        b"x-anything",
    ]
)


@settings(FUZZ, max_examples=300)
@given(
    endpoint=st.sampled_from(list(Endpoint)),
    headers=st.lists(st.tuples(header_name, header_value), max_size=4),
    keep_key=st.booleans(),
)
def test_any_headers_are_never_a_500(
    api: Api, endpoint: Endpoint, headers: list[tuple[bytes, bytes]], keep_key: bool
) -> None:
    body = encode({"model": MODEL, "prompt": "hello there", "max_tokens": 2})
    given = (AUTH[:1] if keep_key else []) + headers
    api.call("POST", endpoint.path, body, given)


@settings(FUZZ, max_examples=200)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "BREW"]),
    suffix=any_text | st.sampled_from(["models", "models/" + MODEL, "chat/completions"]),
)
def test_any_path_and_method_is_never_a_500(api: Api, method: str, suffix: str) -> None:
    api.call(method, "/v1/" + suffix, b"", AUTH)


def test_an_unexpected_exception_is_a_counted_json_500(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(call: object) -> None:
        raise RuntimeError("a bug in dispatch")

    monkeypatch.setattr(api.runtime.dispatcher, "dispatch", broken)
    metrics = api.runtime.metrics
    before = metrics.internal_errors.value(), metrics.requests.value("-", "500", "local")
    body = encode({"model": MODEL, "prompt": "hello", "max_tokens": 2})
    answer = api.loop.run_until_complete(api._call("POST", "/v1/completions", body, AUTH))
    assert answer.status == 500
    assert answer.headers[b"content-type"] == b"application/json"
    assert json.loads(answer.body)["error"]["code"] == "internal_error"
    after = metrics.internal_errors.value(), metrics.requests.value("-", "500", "local")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
