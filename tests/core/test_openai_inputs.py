"""Where the Embeddings and Responses APIs keep their prompt, reduced to chat or text."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import ApiError
from core.openai_inputs import ChatInput, PromptInput, embedding_input, responses_input

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("payload", "found"),
    [
        ({"input": "one"}, PromptInput("one")),
        ({"input": ["one", "two"]}, PromptInput("one")),
        ({"input": [5, 6, 7]}, PromptInput(token_ids=(5, 6, 7))),
        ({"input": [[5, 6], [7]]}, PromptInput(token_ids=(5, 6))),
        ({"input": MESSAGES}, ChatInput(MESSAGES)),
        ({"messages": MESSAGES}, ChatInput(MESSAGES)),
    ],
)
def test_every_embedding_input_shape_gives_its_first_prompt(
    payload: dict[str, Any], found: ChatInput | PromptInput
) -> None:
    assert embedding_input(payload) == found


@pytest.mark.parametrize(
    ("payload", "param", "code"),
    [
        ({}, "input", "missing_required_parameter"),
        ({"input": 3}, "input", "invalid_type"),
        ({"input": []}, "input", "invalid_type"),
        ({"input": ["a", 1]}, "input", "invalid_type"),
        ({"input": [True]}, "input", "invalid_type"),
        ({"messages": "hi"}, "messages", "invalid_type"),
    ],
)
def test_bad_embedding_inputs_name_the_parameter(
    payload: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(ApiError) as info:
        embedding_input(payload)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def test_responses_input_becomes_messages_after_the_instructions() -> None:
    found = responses_input({"instructions": "be brief", "input": "hello"})
    assert found.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
    ]
    assert responses_input({"input": items}).messages == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({}, "input"),
        ({"input": 5}, "input"),
        ({"input": ["x"]}, "input[0]"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input"),
        ({"input": "x", "instructions": 1}, "instructions"),
    ],
)
def test_bad_responses_inputs_name_the_parameter(payload: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as info:
        responses_input(payload)
    assert (info.value.status, info.value.param) == (400, param)
