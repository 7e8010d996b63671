"""Validating OpenAI requests and describing them for the policies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.block_identity import BlockIdentityMode, BlockScheme
from core.blocks import BLOCK_SIZE, block_hashes
from core.errors import ApiError
from core.openai_request import (
    MAX_JSON_DEPTH,
    MAX_TOKEN_ID,
    CompletionRequest,
    Endpoint,
    describe,
    parse_request,
    session_key,
)
from core.prompts import (
    ChatPrompt,
    FallbackEncoder,
    TextPrompt,
    TokenPrompt,
    prompt_text,
    prompt_tokens,
)
from core.tokenizer import WordTokenizer, render_chat
from core.types import RequestDescriptor

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def _body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _refusal(obj: Any, endpoint: Endpoint = Endpoint.CHAT) -> ApiError:
    raw = obj if isinstance(obj, bytes) else _body(obj)
    with pytest.raises(ApiError) as info:
        parse_request(raw, endpoint)
    return info.value


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, "invalid_json"),
        (b"", None, "invalid_json"),
        (b"[1, 2]", None, "invalid_json"),
        ({"messages": []}, "model", "missing_required_parameter"),
        ({"model": 3, "messages": []}, "model", "invalid_type"),
        ({"model": "m"}, "messages", "missing_required_parameter"),
        ({"model": "m", "messages": "hi"}, "messages", "invalid_type"),
        ({"model": "m", "messages": []}, "messages", "invalid_value"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]", "invalid_type"),
        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role", "invalid_type"),
        ({**CHAT, "stream": "yes"}, "stream", "invalid_type"),
        ({**CHAT, "max_tokens": "12"}, "max_tokens", "invalid_type"),
        ({**CHAT, "max_tokens": 0}, "max_tokens", "invalid_value"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({**CHAT, "user": 5}, "user", "invalid_type"),
    ],
)
def test_chat_refusals_name_the_parameter(body: Any, param: str | None, code: str) -> None:
    error = _refusal(body)
    assert (error.status, error.param, error.code) == (400, param, code)


def test_completions_need_a_prompt_of_a_known_shape() -> None:
    assert _refusal({"model": "m"}, Endpoint.COMPLETIONS).param == "prompt"
    assert _refusal({"model": "m", "prompt": {"a": 1}}, Endpoint.COMPLETIONS).code == "invalid_type"
    assert _refusal({"model": "m", "prompt": [1, "a"]}, Endpoint.COMPLETIONS).param == "prompt"


def test_chat_request_is_rendered_with_the_replicas_template() -> None:
    parsed = parse_request(_body({**CHAT, "stream": True}), Endpoint.CHAT)
    assert isinstance(parsed.prompt, ChatPrompt)
    assert prompt_text(parsed.prompt, FallbackEncoder()) == render_chat(CHAT["messages"])
    assert parsed.stream and not parsed.client_wants_usage


def test_streaming_upstream_body_always_asks_for_usage_and_keeps_other_fields() -> None:
    parsed = parse_request(_body({**CHAT, "stream": True, "temperature": 0.2}), Endpoint.CHAT)
    upstream = json.loads(parsed.upstream_body())
    assert upstream["stream_options"] == {"include_usage": True}
    assert upstream["temperature"] == 0.2
    plain = json.loads(parse_request(_body(CHAT), Endpoint.CHAT).upstream_body())
    assert "stream_options" not in plain


def test_descriptor_tokenizes_once_and_hashes_full_blocks_with_the_seed() -> None:
    text = " ".join(f"word{i}" for i in range(40))
    parsed = parse_request(
        _body({"model": "m", "prompt": text, "max_tokens": 7}), Endpoint.COMPLETIONS
    )
    tokens = WordTokenizer().encode(text)
    d = describe(
        parsed,
        tokens,
        request_id="r",
        session_key="s",
        scheme=BlockScheme(meridian_seed="seed"),
        forwarded=True,
    )
    assert d.prompt_tokens == len(tokens) == 40
    assert d.block_hashes == tuple(block_hashes(tokens, seed="seed"))
    assert len(d.block_hashes) == 40 // BLOCK_SIZE
    assert (d.model, d.max_tokens, d.session_key, d.forwarded) == ("m", 7, "s", True)
    assert list(prompt_tokens(parsed.prompt, FallbackEncoder())) == tokens
    other = describe(
        parsed,
        tokens,
        request_id="r",
        session_key="s",
        scheme=BlockScheme(meridian_seed="x"),
        forwarded=False,
    )
    assert other.block_hashes != d.block_hashes


def test_token_id_prompts_are_used_as_is() -> None:
    parsed = parse_request(_body({"model": "m", "prompt": list(range(33))}), Endpoint.COMPLETIONS)
    tokens = prompt_tokens(parsed.prompt, FallbackEncoder())
    d = describe(
        parsed,
        tokens,
        request_id="r",
        session_key="",
        scheme=BlockScheme(meridian_seed="s"),
        forwarded=False,
    )
    assert d.prompt_tokens == 33 and len(d.block_hashes) == 2


def test_session_key_prefers_user_then_header_then_address() -> None:
    with_user = parse_request(_body({**CHAT, "user": "alice"}), Endpoint.CHAT)
    anonymous = parse_request(_body(CHAT), Endpoint.CHAT)
    assert session_key(with_user, "sess-1", "10.0.0.1") == "alice"
    assert session_key(anonymous, "sess-1", "10.0.0.1") == "sess-1"
    assert session_key(anonymous, None, "10.0.0.1") == "10.0.0.1"


def test_upstream_body_is_the_clients_own_bytes_unless_usage_must_be_asked_for() -> None:
    plain = b'{"model": "m", "prompt": "caf\xc3\xa9", "max_tokens": 3}  '
    assert parse_request(plain, Endpoint.COMPLETIONS).upstream_body() == plain

    asked = b'{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}'
    assert parse_request(asked, Endpoint.COMPLETIONS).upstream_body() == asked

    spliced = parse_request(b'{"model":"m","prompt":"x","stream":true}\n', Endpoint.COMPLETIONS)
    body = spliced.upstream_body()
    assert body.startswith(b'{"model":"m","prompt":"x","stream":true')
    assert json.loads(body) == {
        "model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}
    }  # fmt: skip


def test_a_priority_is_spliced_in_unless_the_client_set_its_own() -> None:
    """Engines that schedule by priority get the balancer's (``Choice.priority``), in
    the same splice as the usage option; a client's own priority stands."""
    plain = b'{"model": "m", "prompt": "x"} '
    body = parse_request(plain, Endpoint.COMPLETIONS).upstream_body(1)
    assert body == b'{"model": "m", "prompt": "x", "priority": 1}'
    streamed = parse_request(b'{"model":"m","prompt":"x","stream":true}', Endpoint.COMPLETIONS)
    assert json.loads(streamed.upstream_body(0)) == {
        "model": "m", "prompt": "x", "stream": True,
        "stream_options": {"include_usage": True}, "priority": 0,
    }  # fmt: skip
    own = b'{"model": "m", "prompt": "x", "priority": -5}'
    assert parse_request(own, Endpoint.COMPLETIONS).upstream_body(1) == own
    utf16 = json.dumps({"model": "m", "prompt": "x"}).encode("utf-16")
    assert json.loads(parse_request(utf16, Endpoint.COMPLETIONS).upstream_body(1)) == {
        "model": "m", "prompt": "x", "priority": 1
    }  # fmt: skip
    declined = _body({**CHAT, "stream": True, "stream_options": {"include_usage": False}})
    upstream = json.loads(parse_request(declined, Endpoint.CHAT).upstream_body(1))
    assert upstream["stream_options"] == {"include_usage": True} and upstream["priority"] == 1


def test_other_encodings_and_existing_stream_options_are_reencoded() -> None:
    utf16 = json.dumps({"model": "m", "prompt": "x", "stream": True}).encode("utf-16")
    assert json.loads(parse_request(utf16, Endpoint.COMPLETIONS).upstream_body()) == {
        "model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}
    }  # fmt: skip
    declined = _body({**CHAT, "stream": True, "stream_options": {"include_usage": False}})
    upstream = json.loads(parse_request(declined, Endpoint.CHAT).upstream_body())
    assert upstream["stream_options"] == {"include_usage": True}


def test_every_route_describes_its_prompt_for_routing() -> None:
    text = " ".join(f"word{i}" for i in range(40))
    tokenizer = WordTokenizer()
    bodies = {
        Endpoint.EMBEDDINGS: {"model": "m", "input": [text, "other"]},
        Endpoint.RESPONSES: {"model": "m", "input": text, "max_output_tokens": 9},
        Endpoint.RERANK: {"model": "m", "query": text, "documents": ["a"]},
    }
    described = {
        endpoint: _described(parse_request(_body(body), endpoint))
        for endpoint, body in bodies.items()
    }
    assert described[Endpoint.EMBEDDINGS].prompt_tokens == 40
    assert len(described[Endpoint.EMBEDDINGS].block_hashes) == 40 // BLOCK_SIZE
    responses = described[Endpoint.RESPONSES]
    assert responses.prompt_tokens == len(
        tokenizer.encode(render_chat([{"role": "user", "content": text}]))
    )
    assert responses.max_tokens == 9
    # A cross-encoder's input is the model's own pairing: no blocks, load and session only.
    assert (described[Endpoint.RERANK].prompt_tokens, described[Endpoint.RERANK].block_hashes) == (
        0,
        (),
    )


def test_a_chat_with_no_reply_yet_is_described_as_a_first_turn() -> None:
    system = {"role": "system", "content": "You are terse."}
    ask = {"role": "user", "content": "hello"}
    reply = {"role": "assistant", "content": "hi"}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "42"}

    def first(messages: list[dict[str, str]]) -> bool:
        body = _body({"model": "m", "messages": messages})
        return _described(parse_request(body, Endpoint.CHAT)).first_turn

    assert first([system, ask])
    assert not first([system, ask, reply, ask])
    assert not first([system, ask, tool])
    # A completion's text says nothing of its history: not a first turn.
    text = parse_request(_body({"model": "m", "prompt": "hello"}), Endpoint.COMPLETIONS)
    assert not _described(text).first_turn


def _described(parsed: CompletionRequest) -> RequestDescriptor:
    tokens = prompt_tokens(parsed.prompt, FallbackEncoder())
    return describe(
        parsed,
        tokens,
        request_id="r",
        session_key="s",
        scheme=BlockScheme(meridian_seed="seed"),
        forwarded=False,
    )


def test_chat_options_follow_vllms_defaults_and_are_checked() -> None:
    plain = parse_request(_body(CHAT), Endpoint.CHAT).prompt
    assert isinstance(plain, ChatPrompt)
    assert (plain.add_generation_prompt, plain.add_special_tokens, plain.tools) == (
        True,
        False,
        None,
    )
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = {
        **CHAT,
        "tools": tools,
        "add_generation_prompt": False,
        "chat_template_kwargs": {"x": 1},
    }
    custom = parse_request(_body(body), Endpoint.CHAT).prompt
    assert isinstance(custom, ChatPrompt)
    assert (custom.tools, custom.add_generation_prompt, custom.template_kwargs) == (
        tools,
        False,
        {"x": 1},
    )
    assert _refusal({**CHAT, "tools": "f"}).param == "tools"
    assert _refusal({**CHAT, "chat_template_kwargs": []}).param == "chat_template_kwargs"
    # Embedding chat renders without a generation prompt, as vLLM's embedding route does.
    embedded = parse_request(
        _body({"model": "m", "messages": CHAT["messages"]}), Endpoint.EMBEDDINGS
    )
    assert isinstance(embedded.prompt, ChatPrompt) and not embedded.prompt.add_generation_prompt


def test_only_chat_and_completions_streams_get_the_usage_option() -> None:
    embeddings = b'{"model": "m", "input": "x", "stream": true}'
    parsed = parse_request(embeddings, Endpoint.EMBEDDINGS)
    assert not parsed.stream and parsed.upstream_body() == embeddings
    responses = b'{"model": "m", "input": "x", "stream": true, "stream_options": {"a": 1}}'
    parsed = parse_request(responses, Endpoint.RESPONSES)
    assert parsed.stream and parsed.upstream_body() == responses


def test_unknown_fields_reach_the_replica_unchanged() -> None:
    extra = {
        "temperature": 0.1 + 0.2,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "vendor_knob": {"nested": [1, 2.5e-300, "caf\u00e9", None, 10**30]},
    }
    raw = _body({**CHAT, **extra})
    assert parse_request(raw, Endpoint.CHAT).upstream_body() == raw
    streamed = _body({**CHAT, **extra, "stream": True, "stream_options": {"continuous": 1}})
    upstream = json.loads(parse_request(streamed, Endpoint.CHAT).upstream_body())
    assert upstream == {
        **CHAT, **extra, "stream": True, "stream_options": {"continuous": 1, "include_usage": True}
    }  # fmt: skip


def test_empty_stream_options_without_a_stream_pass_as_vllm_lets_them() -> None:
    parsed = parse_request(_body({**CHAT, "stream_options": {}}), Endpoint.CHAT)
    assert not parsed.stream and not parsed.client_wants_usage


def test_the_descriptor_keys_blocks_under_the_models_scheme() -> None:
    parsed = parse_request(_body({"model": "m", "prompt": list(range(70))}), Endpoint.COMPLETIONS)
    scheme = BlockScheme(BlockIdentityMode.VLLM, block_size=32)
    tokens = list(range(70))
    d = describe(
        parsed, tokens, request_id="r", session_key="", scheme=scheme, forwarded=False, lora="sql"
    )
    assert d.block_hashes == tuple(scheme.keys(tokens, "sql"))
    assert len(d.block_hashes) == 2  # 70 tokens: two full 32-token blocks


# Inputs that once reached a 500 (issue 14), each refused as the client's mistake.


@pytest.mark.parametrize(
    ("body", "endpoint"),
    [
        (b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}', Endpoint.CHAT),
        (b'{"model": "m", "prompt": "\\uDFFF"}', Endpoint.COMPLETIONS),
        (b'{"model": "m", "input": ["\\ud83d"]}', Endpoint.EMBEDDINGS),
        (b'{"model": "m", "prompt": "x", "\\ud800": 1}', Endpoint.COMPLETIONS),
        ('{"model": "m", "prompt": "\\ud800"}'.encode("utf-16"), Endpoint.COMPLETIONS),
    ],
)
def test_a_lone_surrogate_anywhere_is_invalid_json(body: bytes, endpoint: Endpoint) -> None:
    error = _refusal(body, endpoint)
    assert (error.status, error.code) == (400, "invalid_json")
    assert "surrogate" in error.message


def test_a_surrogate_pair_and_an_escaped_backslash_are_fine() -> None:
    pair = parse_request(b'{"model": "m", "prompt": "\\ud83d\\ude00"}', Endpoint.COMPLETIONS)
    assert pair.prompt == TextPrompt("\U0001f600")
    escaped = parse_request(b'{"model": "m", "prompt": "\\\\ud800"}', Endpoint.COMPLETIONS)
    assert escaped.prompt == TextPrompt("\\ud800")


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 1000, 100_000])
def test_nesting_past_the_cap_is_invalid_json(depth: int) -> None:
    body = b'{"model": "m", "prompt": "x", "extra": ' + b"[" * depth + b"]" * depth + b"}"
    error = _refusal(body, Endpoint.COMPLETIONS)
    assert (error.status, error.code) == (400, "invalid_json")
    assert "nests deeper" in error.message


def test_nesting_within_the_cap_passes_through() -> None:
    depth = MAX_JSON_DEPTH - 2  # the body object and the "extra" list count too
    body = b'{"model": "m", "prompt": "x", "extra": ' + b"[" * depth + b"]" * depth + b"}"
    assert parse_request(body, Endpoint.COMPLETIONS).payload["extra"]


@pytest.mark.parametrize("token", [-1, MAX_TOKEN_ID + 1, 1 << 64])
@pytest.mark.parametrize(
    ("field", "endpoint", "param"),
    [
        ("prompt", Endpoint.COMPLETIONS, "prompt[1]"),
        ("input", Endpoint.EMBEDDINGS, "input[1]"),
    ],
)
def test_token_ids_outside_the_hashed_range_are_refused(
    token: int, field: str, endpoint: Endpoint, param: str
) -> None:
    error = _refusal({"model": "m", field: [5, token]}, endpoint)
    assert (error.status, error.code, error.param) == (400, "invalid_value", param)


def test_token_ids_at_the_bounds_are_hashed() -> None:
    request = parse_request(
        _body({"model": "m", "prompt": [0, MAX_TOKEN_ID] * BLOCK_SIZE}), Endpoint.COMPLETIONS
    )
    assert request.prompt == TokenPrompt((0, MAX_TOKEN_ID) * BLOCK_SIZE)
    assert block_hashes(list(request.prompt.token_ids))
