"""The OpenAI surface as a proxy, end to end: the official client → a daphne balancer →
emulated replicas (two generative ones with a tool parser, one pooling model).

What the balancer answers itself (model cards, unknown paths, wrong methods) and
what it passes on (embeddings, tools, response_format, logprobs, any field it
does not know) are checked the way a client sees them; the replicas'
``/debug/requests`` shows the bodies they received.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from ops import http_probe
from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    client,
    metric_value,
    start_balancer,
    start_replicas,
)
from tests.support.processes import ProcessGroup, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

EMBED_MODEL = "meridian-embed"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 3},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
]
WEATHER_CHOICE: Any = {"type": "function", "function": {"name": "get_weather"}}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Lisbon this week?"}]


@dataclass(frozen=True)
class Surface:
    url: str
    key: str
    ports: dict[str, int]

    def openai(self) -> openai.OpenAI:
        return client(self.url, self.key)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture(scope="module")
def surface(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Surface]:
    chat_ports = {"os-a": free_port(), "os-b": free_port()}
    embed_ports = {"os-embed": free_port()}
    balancer_port = free_port()
    region = topology.region("os-us")
    topology.balancer("os-us-lb", region, balancer_port)
    for name, port in chat_ports.items():
        topology.replica(name, region, port)
    for name, port in embed_ports.items():
        topology.replica(name, region, port, model=EMBED_MODEL)
    topology.service()
    topology.service(EMBED_MODEL)
    key = topology.api_key()
    tools = ("--tool-call-parser", "hermes", "--enable-auto-tool-choice")
    start_replicas(module_processes, "os-chat", chat_ports, *tools)
    start_replicas(
        module_processes, "os-embed", embed_ports, "--runner", "pooling", model=EMBED_MODEL
    )
    url = start_balancer(module_processes, child_env, "os-us-lb", balancer_port)
    yield Surface(url, key, {**chat_ports, **embed_ports})


def received(surface: Surface, request_id: str) -> dict[str, Any]:
    """The request a replica received with this X-Request-ID, as it arrived."""
    for port in surface.ports.values():
        log = http_probe.get(f"http://127.0.0.1:{port}/debug/requests").json()["requests"]
        for entry in log:
            if entry["request_id"] == request_id:
                return dict(entry)
    raise AssertionError(f"no replica received {request_id}")


# -- what the balancer answers itself ---------------------------------------------------


def test_models_retrieve_answers_from_the_balancers_topology(surface: Surface) -> None:
    api = surface.openai()
    card = api.models.retrieve(EMBED_MODEL)
    assert (card.id, card.object, card.owned_by) == (EMBED_MODEL, "model", "meridian")
    assert sorted(m.id for m in api.models.list()) == [EMBED_MODEL, MODEL]
    with pytest.raises(openai.NotFoundError) as missing:
        api.models.retrieve("gpt-nope")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        client(surface.url, "mk-wrong").models.retrieve(MODEL)


def test_unknown_paths_and_wrong_methods_get_json_errors_counted_in_metrics(
    surface: Surface,
) -> None:
    before = metric_value(surface.url, 'meridian_unknown_path_requests_total{method="POST"}')
    for method, path, status, code in [
        ("POST", "/v1/nothing/here", 404, "unknown_url"),
        ("GET", "/v1/models/", 404, "unknown_url"),
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("DELETE", "/v1/embeddings", 405, "method_not_allowed"),
        ("POST", "/v1/models", 405, "method_not_allowed"),
    ]:
        response = httpx.request(method, f"{surface.url}{path}", headers=surface.auth())
        assert response.status_code == status, path
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    after = metric_value(surface.url, 'meridian_unknown_path_requests_total{method="POST"}')
    assert after == before + 1
    assert metric_value(surface.url, 'meridian_requests_total{model="-",status="405"') >= 3


# -- what it passes on ------------------------------------------------------------------


def test_embeddings_are_proxied_to_the_pooling_replica(surface: Surface) -> None:
    api = surface.openai()
    raw = api.embeddings.with_raw_response.create(
        model=EMBED_MODEL, input=["the harbour at dawn", "the harbour at dusk"]
    )
    result = raw.parse()  # the SDK asked for base64 and decoded it
    assert raw.headers["x-meridian-replica"] == "os-embed"
    assert [len(item.embedding) for item in result.data] == [384, 384]
    assert result.usage.prompt_tokens > 0
    floats = api.embeddings.create(model=EMBED_MODEL, input=[1, 2, 3], encoding_format="float")
    assert abs(sum(v * v for v in floats.data[0].embedding) - 1.0) < 1e-6


def test_a_route_the_models_replicas_do_not_serve_is_an_openai_shaped_404(
    surface: Surface,
) -> None:
    with pytest.raises(openai.NotFoundError) as generative:
        surface.openai().embeddings.create(model=MODEL, input="x")
    assert "do not serve /v1/embeddings" in generative.value.message
    with pytest.raises(openai.NotFoundError):
        surface.openai().chat.completions.create(model=EMBED_MODEL, messages=ASK)


def test_a_named_tool_choice_is_a_tool_call_with_schema_valid_arguments(surface: Surface) -> None:
    completion = surface.openai().chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=WEATHER_CHOICE
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"  # vLLM's finish reason for a named tool
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_a_streamed_required_tool_call_arrives_as_deltas(surface: Surface) -> None:
    stream = surface.openai().chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS[1:],
        tool_choice="required",
        stream=True,
        stream_options={"include_usage": True},
    )
    names, ids, arguments, finish, usage = [], [], "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0
                ids += [delta.id] if delta.id else []
                names += [delta.function.name] if delta.function and delta.function.name else []
                arguments += (delta.function.arguments or "") if delta.function else ""
    assert names == ["get_weather"] and len(ids) == 1
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMETERS)
    assert finish == "tool_calls"
    assert usage is not None and usage.completion_tokens > 1


def test_auto_calls_a_tool_then_answers_the_tool_result_in_text(surface: Surface) -> None:
    api = surface.openai()
    first = api.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS[:1])
    (call,) = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "12:00"},
    ]
    second = api.chat.completions.create(model=MODEL, messages=history, tools=TOOLS[:1])
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls


def test_response_format_makes_the_answer_valid_json(surface: Surface) -> None:
    api = surface.openai()
    shaped = api.chat.completions.create(
        model=MODEL,
        messages=ASK,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": WEATHER_PARAMETERS},
        },
    )
    jsonschema.validate(json.loads(shaped.choices[0].message.content or ""), WEATHER_PARAMETERS)
    # vLLM's completions take response_format too; OpenAI's SDK passes it as an extra.
    plain = api.completions.create(
        model=MODEL,
        prompt="Describe Lisbon",
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert isinstance(json.loads(plain.choices[0].text), dict)


def test_logprobs_describe_the_tokens_that_were_sent(surface: Surface) -> None:
    api = surface.openai()
    chat = api.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=6, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content if chat.choices[0].logprobs else None
    assert content is not None and len(content) == 6
    assert "".join(entry.token for entry in content) == chat.choices[0].message.content
    assert all(len(entry.top_logprobs) == 3 and entry.logprob < 0 for entry in content)
    completion = api.completions.create(model=MODEL, prompt="Once", max_tokens=4, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert [len(top) for top in logprobs.top_logprobs or []] == [3, 3, 3, 3]
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model=MODEL, messages=ASK, top_logprobs=2)
    assert "`logprobs` must be set to true" in refused.value.message


def test_fields_the_balancer_does_not_know_reach_the_replica_unchanged(surface: Surface) -> None:
    extra = {"top_k": 5, "vendor_knob": {"nested": [1, 2.5, "café", None]}, "min_p": 0.05}
    body = {"model": MODEL, "messages": ASK, "max_tokens": 3, **extra}
    request_id = uuid.uuid4().hex
    sent = json.dumps(body, ensure_ascii=False).encode()
    response = http_probe.post(
        f"{surface.url}/v1/chat/completions",
        content=sent,
        headers={**surface.auth(), "X-Request-ID": request_id, "Content-Type": "application/json"},
    )
    assert response.status_code == 200
    assert received(surface, request_id)["body"].encode() == sent  # byte for byte
    streamed_id = uuid.uuid4().hex
    with surface.openai().chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=ASK,
        max_tokens=3,
        stream=True,
        extra_body=extra,
        extra_headers={"X-Request-ID": streamed_id},
    ) as stream:
        stream.read()
    upstream = json.loads(received(surface, streamed_id)["body"])
    # The one change: a stream always asks for usage, for the balancer's accounting.
    assert upstream["stream_options"] == {"include_usage": True}
    assert {name: upstream[name] for name in extra} == extra


def test_the_responses_api_is_proxied_streamed_or_not_and_its_usage_counted(
    surface: Surface,
) -> None:
    api = surface.openai()
    before = metric_value(surface.url, "meridian_prompt_tokens_total")
    raw = api.responses.with_raw_response.create(
        model=MODEL, instructions="Be brief.", input="Describe Lisbon.", max_output_tokens=5
    )
    response = raw.parse()
    assert raw.headers["x-meridian-replica"] in ("os-a", "os-b")
    assert response.status == "incomplete" and response.output_text
    assert response.usage is not None and response.usage.output_tokens == 5
    events = list(
        api.responses.create(model=MODEL, input="Describe Porto.", max_output_tokens=4, stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    completed = events[-1].response  # type: ignore[union-attr]
    assert deltas == completed.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert completed.usage is not None
    # The balancer read the Responses usage names, whole and streamed.
    after = metric_value(surface.url, "meridian_prompt_tokens_total")
    assert after - before == response.usage.input_tokens + completed.usage.input_tokens
