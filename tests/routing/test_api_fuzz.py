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

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.openai_request import Endpoint
from tests.support.api_app import AUTH, BODY_LIMIT, Api, serving_api
from tests.support.balancers import MODEL

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    # Keyless examples are many: no hold-down, so every example reaches the views.
    with serving_api(auth_failure_limit=1 << 30) as served:
        yield served


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
    answer = api.fetch("POST", "/v1/completions", body, AUTH)
    assert answer.status == 500
    assert answer.headers[b"content-type"] == b"application/json"
    assert json.loads(answer.body)["error"]["code"] == "internal_error"
    after = metrics.internal_errors.value(), metrics.requests.value("-", "500", "local")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
