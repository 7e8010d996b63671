"""Pure request parsing and the generated vocabulary, without a server."""

from __future__ import annotations

import json

import pytest

from routing.core.tokenizer import WordTokenizer, render_chat
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
    ],
)
def test_malformed_fields_name_the_offending_parameter(body: dict[str, object], param: str) -> None:
    kind: Kind = "chat" if "messages" in body else "completion"
    with pytest.raises(APIError) as raised:
        parse(kind, **body)
    assert raised.value.status == 400 and raised.value.body["error"]["param"] == param
