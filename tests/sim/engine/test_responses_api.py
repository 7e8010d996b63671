"""The emulated Responses API: request forms, refusals, and vLLM's response and events."""

from __future__ import annotations

import json

import pytest

from core.tokenizer import WordTokenizer, render_chat
from sim.engine import Vocabulary
from sim.engine.openai_answers import usage
from sim.engine.openai_protocol import APIError, GenerationRequest
from sim.engine.responses_api import ResponsesAnswer, parse_responses

TOKENIZER = WordTokenizer()
VOCAB = Vocabulary(TOKENIZER)


def parse(**body: object) -> GenerationRequest:
    raw = json.dumps({"model": "m", **body}).encode()
    return parse_responses(raw, model="m", tokenizer=TOKENIZER, vocab=VOCAB, max_model_len=200)


def test_instructions_and_input_are_rendered_as_chat() -> None:
    request = parse(instructions="be brief", input="hello", max_output_tokens=7)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    assert request.prompt_token_ids == TOKENIZER.encode(render_chat(messages))
    assert (request.kind, request.max_tokens, request.stream) == ("responses", 7, False)


def test_text_format_json_schema_forces_a_schema_shaped_answer() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    request = parse(
        input="x", text={"format": {"type": "json_schema", "name": "s", "schema": schema}}
    )
    assert request.plan.text == '{"ok": true}'


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, 400, "tools"),
        ({"input": "x", "previous_response_id": "resp_1"}, 400, "previous_response_id"),
        ({"input": 3}, 400, "input"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "x", "model": "other"}, 404, "model"),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, 400, "text.format"),
    ],
)
def test_what_it_cannot_honour_is_refused(body: dict[str, object], status: int, param: str) -> None:
    with pytest.raises(APIError) as info:
        parse(**body)
    assert (info.value.status, info.value.body["error"]["param"]) == (status, param)


def test_the_event_stream_and_the_whole_response_agree() -> None:
    answer = ResponsesAnswer(parse(input="x"), created=1)
    events = [*answer.opening(), answer.delta(" ka"), answer.delta(" lo")]
    events += answer.closing("length", usage(10, 2, 4))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["content"][0]["text"] == " ka lo"
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 4}
    assert (final["usage"]["input_tokens"], final["usage"]["output_tokens"]) == (10, 2)
