"""Tools and response_format: vLLM's validation and messages, and what the model writes."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from core.tokenizer import WordTokenizer
from sim.engine.structured import (
    OutputPlan,
    StructuredError,
    ToolCall,
    ToolSupport,
    forced_tokens,
    plan_chat,
    plan_format,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "weather?"}]
PARSER = ToolSupport("hermes", auto=True)


def plan(support: ToolSupport = PARSER, **body: Any) -> OutputPlan:
    return plan_chat({"messages": ASK, **body}, support, itertools.cycle([" kalo", " mine"]))


def test_a_named_tool_choice_calls_that_tool_with_schema_shaped_arguments() -> None:
    chosen = plan(
        tools=[CLOCK, WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert chosen.tool_call == ToolCall("get_weather", "named")
    assert chosen.text is not None and json.loads(chosen.text) == {"city": "kalo mine", "days": 1}


def test_required_and_auto_call_the_first_tool_and_auto_stops_after_a_tool_result() -> None:
    assert plan(tools=[CLOCK, WEATHER], tool_choice="required").tool_call == ToolCall(
        "get_time", "required"
    )
    assert plan(tools=[CLOCK]).tool_call == ToolCall("get_time", "auto")  # no choice: auto
    answered = [*ASK, {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]
    assert plan(tools=[CLOCK], messages=answered).tool_call is None
    assert plan(tools=[CLOCK], tool_choice="none") == OutputPlan()


def test_without_a_parser_tool_choices_are_refused_with_vllms_messages() -> None:
    bare = ToolSupport()
    with pytest.raises(StructuredError, match=r'"auto" tool choice requires --enable-auto'):
        plan(bare, tools=[CLOCK])
    with pytest.raises(StructuredError, match=r'tool_choice="required" requires --tool-call'):
        plan(bare, tools=[CLOCK], tool_choice="required")
    named = {"type": "function", "function": {"name": "get_time"}}
    with pytest.raises(StructuredError, match=r'tool_choice=function "get_time" requires'):
        plan(bare, tools=[CLOCK], tool_choice=named)
    assert plan(bare, tools=[CLOCK], tool_choice="none") == OutputPlan()
    # A parser without --enable-auto-tool-choice: vLLM answers auto in plain text.
    assert plan(ToolSupport("hermes"), tools=[CLOCK]) == OutputPlan()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": []}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [CLOCK], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [CLOCK], "tool_choice": {"type": "function"}}, "tool_choice.function"),
        (
            {"tools": [CLOCK], "tool_choice": {"function": {"name": ""}}},
            "tool_choice.function.name",
        ),
        ({"tools": [CLOCK], "tool_choice": {"function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "structural_tag", "format": {}}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"not": {}}},
                }
            },
            "response_format",
        ),
    ],
)
def test_malformed_tool_and_format_fields_are_400s_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(StructuredError) as info:
        plan(**body)
    assert info.value.param == param


def test_response_format_makes_the_answer_json() -> None:
    words = itertools.cycle([" kalo"])
    assert plan_format({"response_format": {"type": "text"}}, words) == OutputPlan()
    as_object = plan_format({"response_format": {"type": "json_object"}}, words)
    assert as_object.text is not None and json.loads(as_object.text) == {
        "text": "kalo " * 5 + "kalo"
    }
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    shaped = plan_format(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            }
        },
        words,
    )
    assert shaped == OutputPlan('{"ok": true}')


def test_forced_text_becomes_tokens_whose_pieces_rebuild_it() -> None:
    tokenizer = WordTokenizer()
    text = '{"city": "Zürich  am See", "days": 1}'
    forced = forced_tokens(text, tokenizer)
    assert "".join(forced.pieces) == text
    assert list(forced.token_ids) == tokenizer.encode(text)
