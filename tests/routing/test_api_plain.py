"""The inference routes on plain ASGI (``routing.api_plain``) answer as Django's path does.

Each request goes through both applications a balancer could serve it with, the body
limit in front of ``PlainApi`` and in front of ``ApiASGIHandler`` alone, over one real
``BalancerRuntime`` whose replicas are loopback servers: the statuses, bodies and
headers must match, refusals included, and every request must give its slot back,
also when its client leaves while the replica works or while the stream is relayed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from routing.api_asgi import ApiASGIHandler
from routing.api_plain import PlainApi
from routing.asgi_types import ASGIApp
from routing.body_limit import BodyLimitMiddleware
from routing.views import completions
from tests.support.api_app import AUTH, BODY_LIMIT, Answer, Api, serving_api
from tests.support.balancers import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    with serving_api(auth_failure_limit=1 << 30) as served:
        yield served


def _django_path() -> ASGIApp:
    return BodyLimitMiddleware(ApiASGIHandler(), BODY_LIMIT)


def _both(
    api: Api, method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> tuple[Answer, Answer]:
    """The plain path's answer and the Django path's, to the same request."""
    plain = api.call(method, path, body, headers)
    api.app, plain_app = _django_path(), api.app
    try:
        django = api.call(method, path, body, headers)
    finally:
        api.app = plain_app
    return plain, django


def _comparable(answer: Answer) -> dict[bytes, bytes]:
    # Django's own response adds nothing a client relies on beyond what both send;
    # a body's length is sent by the plain path, by the server under Django's.
    return {name: value for name, value in answer.headers.items() if name != b"content-length"}


REQUESTS = [
    pytest.param("POST", "/v1/chat/completions", CHAT, AUTH, id="chat"),
    pytest.param("POST", "/v1/completions", {"model": MODEL, "prompt": "hi"}, AUTH, id="text"),
    pytest.param("POST", "/v1/embeddings", {"model": MODEL, "input": "hi"}, AUTH, id="embed"),
    pytest.param("POST", "/v1/chat/completions", CHAT, [], id="no-key"),
    pytest.param(
        "POST",
        "/v1/chat/completions",
        CHAT,
        [(b"authorization", b"Bearer mk-wrong")],
        id="wrong-key",
    ),
    pytest.param("GET", "/v1/chat/completions", CHAT, AUTH, id="get"),
    pytest.param("POST", "/v1/chat/completions", {"model": "nope"}, AUTH, id="no-messages"),
    pytest.param(
        "POST", "/v1/chat/completions", {**CHAT, "model": "unknown"}, AUTH, id="unknown-model"
    ),
    pytest.param("POST", "/v1/completions", b"{not json", AUTH, id="bad-json"),
    pytest.param(
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi"},
        [*AUTH, (b"content-length", b"12x")],
        id="bad-length",
    ),
]


@pytest.mark.parametrize(("method", "path", "payload", "headers"), REQUESTS)
def test_the_plain_path_answers_as_djangos_does(
    api: Api, method: str, path: str, payload: Any, headers: list[tuple[bytes, bytes]]
) -> None:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = [*headers, (b"x-request-id", b"rid-compare")]
    plain, django = _both(api, method, path, body, headers)
    assert plain.status == django.status
    assert json.loads(plain.body) == json.loads(django.body)
    assert _comparable(plain) == _comparable(django)
    assert plain.headers[b"content-length"] == str(len(plain.body)).encode()
    assert plain.headers[b"x-request-id"] == b"rid-compare"


def test_a_refusal_is_counted_once_as_on_djangos_path(api: Api) -> None:
    requests = api.runtime.metrics.requests
    before = requests.value("-", "401", "local")
    api.call("POST", "/v1/chat/completions", json.dumps(CHAT).encode(), [])
    assert requests.value("-", "401", "local") == before + 1


def test_a_stream_is_relayed_chunk_by_chunk_and_settled(api: Api) -> None:
    requests = api.runtime.metrics.requests
    before = requests.value(MODEL, "200", "local")
    body = json.dumps({**CHAT, "stream": True}).encode()
    messages = api.loop.run_until_complete(_exchange(api.app, body))
    start, parts = messages[0], messages[1:]
    assert start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"cache-control"] == b"no-cache" and b"content-length" not in headers
    assert all(part["more_body"] for part in parts[:-1]) and not parts[-1].get("more_body")
    text = b"".join(part["body"] for part in parts)
    assert b'"content": "hi"' in text and text.endswith(b"data: [DONE]\n\n")
    assert b"usage" not in text  # the client did not ask for it
    assert requests.value(MODEL, "200", "local") == before + 1
    assert api.runtime.inflight() == 0


def test_other_paths_go_on_to_the_fallback(api: Api) -> None:
    answer = api.call("GET", "/v1/models", b"", AUTH)
    assert answer.status == 200 and json.loads(answer.body)["data"][0]["id"] == MODEL
    missing = api.call("POST", "/v1/chat/completions/", b"{}", AUTH)  # not an Endpoint path
    assert missing.status == 404 and json.loads(missing.body)["error"]["code"] == "unknown_url"


def test_a_body_past_the_limit_is_refused_unread_without_the_middleware(api: Api) -> None:
    app = PlainApi(ApiASGIHandler(), 16)
    body = json.dumps(CHAT).encode()
    messages = api.loop.run_until_complete(_exchange(app, body, declare_length=False))
    assert messages[0]["status"] == 413
    error = json.loads(messages[1]["body"])["error"]
    assert error["code"] == "request_too_large"
    assert api.runtime.inflight() == 0


def test_a_request_without_an_id_gets_a_fresh_uuid4(api: Api) -> None:
    body = json.dumps(CHAT).encode()
    answers = [api.call("POST", "/v1/chat/completions", body, AUTH) for _ in range(20)]
    ids = {answer.headers[b"x-request-id"].decode() for answer in answers}
    assert len(ids) == 20
    for given in ids:
        parsed = uuid.UUID(hex=given)
        assert parsed.hex == given
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)


def test_a_large_prompt_is_tokenized_and_described_in_one_worker_thread(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int]] = []

    def noting(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def noted(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, threading.get_ident()))
            return function(*args, **kwargs)

        return noted

    monkeypatch.setattr(completions, "prompt_tokens", noting("tokens", completions.prompt_tokens))
    monkeypatch.setattr(completions, "describe", noting("describe", completions.describe))
    monkeypatch.setattr(api.runtime.encoders, "thread_chars", 1000)
    loop_thread = threading.get_ident()  # the harness runs the loop in this thread
    small = {**CHAT, "messages": [{"role": "user", "content": "x " * 100}]}
    large = {**CHAT, "messages": [{"role": "user", "content": "word " * 1000}]}
    api.call("POST", "/v1/chat/completions", json.dumps(small).encode(), AUTH)
    assert seen == [("tokens", loop_thread), ("describe", loop_thread)]
    seen.clear()
    api.call("POST", "/v1/chat/completions", json.dumps(large).encode(), AUTH)
    (_, worker), (_, describer) = seen
    assert [name for name, _ in seen] == ["tokens", "describe"]
    assert worker == describer != loop_thread


def test_a_limit_below_one_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 byte"):
        PlainApi(ApiASGIHandler(), 0)


def test_a_client_gone_before_its_body_is_in_gets_nothing(api: Api) -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    api.loop.run_until_complete(api.app(_scope(), receive, send))
    assert sent == []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_client_gone_while_the_replica_works_gives_the_slot_back(stream: bool) -> None:
    with serving_api({"a": "hold", "b": "hold"}) as api:
        requests = api.runtime.metrics.requests
        body = json.dumps({**CHAT, "stream": stream}).encode()
        sent: list[dict[str, Any]] = []

        async def scenario() -> None:
            left = asyncio.Event()
            receive = _body_then_leave(body, left)

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            served = asyncio.create_task(api.app(_scope(rid="rid-gone"), receive, send))
            while api.runtime.inflight() == 0:
                await asyncio.sleep(0.01)
            left.set()
            await served
            api.upstreams.release("rid-gone")

        api.loop.run_until_complete(scenario())
        assert sent == []
        assert api.runtime.inflight() == 0
        assert requests.value(MODEL, "200", "local") == 0


def test_the_server_cancelling_a_request_is_not_taken_for_a_client_gone() -> None:
    # The work runs in the server's task: a cancellation of that task (shutdown) must
    # reach the server, while the slot is still given back.
    with serving_api({"a": "hold", "b": "hold"}) as api:
        body = json.dumps(CHAT).encode()

        async def scenario() -> None:
            receive = _body_then_leave(body, asyncio.Event())

            async def send(message: dict[str, Any]) -> None:
                raise AssertionError(f"nothing is sent to a cancelled request: {message}")

            served = asyncio.create_task(api.app(_scope(rid="rid-shut"), receive, send))
            while api.runtime.inflight() == 0:
                await asyncio.sleep(0.01)
            served.cancel()
            with pytest.raises(asyncio.CancelledError):
                await served
            api.upstreams.release("rid-shut")

        api.loop.run_until_complete(scenario())
        assert api.runtime.inflight() == 0


def test_a_client_gone_mid_stream_settles_it_as_closed(api: Api) -> None:
    requests = api.runtime.metrics.requests
    before = requests.value(MODEL, "499", "local")
    body = json.dumps({**CHAT, "stream": True}).encode()
    sent: list[dict[str, Any]] = []

    async def scenario() -> None:
        left = asyncio.Event()
        receive = _body_then_leave(body, left)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.start":
                left.set()
                await asyncio.sleep(0.5)  # the server is slow to write; the client leaves

        await api.app(_scope(), receive, send)

    api.loop.run_until_complete(scenario())
    assert [m["type"] for m in sent] == ["http.response.start"]
    assert api.runtime.inflight() == 0
    assert requests.value(MODEL, "499", "local") == before + 1


def _body_then_leave(body: bytes, left: asyncio.Event) -> Callable[[], Awaitable[dict[str, Any]]]:
    """An ASGI ``receive``: the whole body at once, then a disconnect once ``left`` is set."""
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    return receive


def _scope(rid: str = "rid-plain", *, declare_length: int | None = None) -> dict[str, Any]:
    headers = [*AUTH, (b"x-request-id", rid.encode())]
    if declare_length is not None:
        headers.append((b"content-length", str(declare_length).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def _exchange(app: ASGIApp, body: bytes, *, declare_length: bool = True) -> list[Any]:
    """Every message ``app`` sends for one chat request whose body comes in two parts."""
    parts = [body[: len(body) // 2], body[len(body) // 2 :]]
    finished = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if parts:
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(parts)}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            finished.set()

    await app(_scope(declare_length=len(body) if declare_length else None), receive, send)
    return sent
