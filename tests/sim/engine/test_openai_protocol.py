"""Pure request parsing and the generated vocabulary, without a server."""

from __future__ import annotations

import json

import pytest

from core.tokenizer import WordTokenizer, render_chat
from sim.engine import Vocabulary
from sim.engine.openai_protocol import APIError, GenerationRequest, Kind, parse_generation

TOKENIZER = WordTokenizer()


VOCAB = Vocabulary(TOKENIZER)


def parse(kind: Kind, **body: object) -> GenerationRequest:
    return parse_generation(
        kind,
        json.dumps({"model": "m", **body}).encode(),
        model="m",
        tokenizer=TOKENIZER,
        vocab=VOCAB,
        max_model_len=100,
        loras={"sql": 1},
    )


def test_generated_text_tokenizes_back_to_the_generated_ids(vocab: Vocabulary) -> None:
    ids = vocab.token_ids[:50]
    assert TOKENIZER.encode(vocab.text(ids)) == ids


def test_chat_prompts_are_rendered_with_the_shared_template() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    parsed = parse("chat", messages=messages)
    assert parsed.prompt_token_ids == TOKENIZER.encode(render_chat(messages))
    assert parsed.max_tokens == 100 - len(parsed.prompt_token_ids)


def test_prompt_forms_and_lora_selection() -> None:
    single = parse("completion", prompt=["one two"])
    assert single.prompt_token_ids == TOKENIZER.encode("one two")
    lora = parse("completion", model="sql", prompt=[5, 6, 7])
    assert (lora.prompt_token_ids, lora.lora_name, lora.lora_id) == ([5, 6, 7], "sql", 1)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages"),
        ({"prompt": "x", "priority": "high"}, "priority"),
        ({"prompt": "x", "priority": 1.5}, "priority"),
    ],
)
def test_malformed_fields_name_the_offending_parameter(body: dict[str, object], param: str) -> None:
    kind: Kind = "chat" if "messages" in body else "completion"
    with pytest.raises(APIError) as raised:
        parse(kind, **body)
    assert raised.value.status == 400 and raised.value.body["error"]["param"] == param


@pytest.mark.parametrize(
    ("kind", "body", "param", "words"),
    [
        ("chat", {"top_logprobs": 2}, "top_logprobs", "`logprobs` must be set to true"),
        ("chat", {"logprobs": True, "top_logprobs": "2"}, "top_logprobs", "must be an integer"),
        ("chat", {"logprobs": True, "top_logprobs": -3}, "top_logprobs", "positive value or -1"),
        (
            "chat",
            {"logprobs": True, "top_logprobs": 21},
            "logprobs",
            "greater than max allowed: 20",
        ),
        ("chat", {"logprobs": True, "top_logprobs": -1}, "logprobs", "greater than max allowed"),
        ("completion", {"logprobs": 30}, "logprobs", "Requested sample logprobs of 30"),
        ("completion", {"echo": True}, "echo", "not supported by the emulated replica"),
        ("chat", {"structured_outputs": {"json": {}}}, "structured_outputs", "not supported"),
        ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, None, "auto"),
    ],
)
def test_answer_shaping_fields_are_honoured_or_refused_never_dropped(
    kind: Kind, body: dict[str, object], param: str | None, words: str
) -> None:
    prompt: dict[str, object] = (
        {"messages": [{"role": "user", "content": "x"}]} if kind == "chat" else {"prompt": "x"}
    )
    with pytest.raises(APIError) as raised:
        parse(kind, **prompt, **body)
    error = raised.value.body["error"]
    assert raised.value.status == 400 and error["param"] == param and words in error["message"]


def test_logprob_counts_and_a_structured_plan_reach_the_request() -> None:
    chat = parse("chat", messages=[{"role": "user", "content": "x"}], logprobs=True)
    assert chat.logprobs == 0 and chat.forced is None
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    shaped = parse(
        "completion",
        prompt="x",
        logprobs=3,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    assert shaped.logprobs == 3 and shaped.plan.text == '{"n": 1}'
    assert shaped.forced is not None and "".join(shaped.forced.pieces) == '{"n": 1}'


def test_a_request_priority_reaches_the_engine_request() -> None:
    """vLLM's ``priority`` field (0 unless given); the engine decides whether it may
    be anything else (``sim.engine.schedule_policy``)."""
    assert parse("completion", prompt="x").priority == 0
    assert parse("completion", prompt="x", priority=-2).priority == -2
