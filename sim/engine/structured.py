"""Tools and ``response_format`` as vLLM 0.32 answers them, for the emulated replica.

Validation follows vLLM's ``ChatCompletionRequest`` validators and its
renderer's tool-choice check, with the same messages:

* ``tools: []`` is refused; ``tools`` without ``tool_choice`` means ``"auto"``;
  ``tool_choice`` without ``tools``, an unknown string, or a named function
  that is not among the tools is refused.
* ``"none"`` answers text and ignores the tools.
* Without a tool parser (vLLM's ``--tool-call-parser``, the emulator's flag of
  the same name) ``"auto"``, ``"required"`` and a named function are refused
  with vLLM's 400: vLLM never silently drops a tool call, and neither does this.
* ``"auto"`` also needs ``--enable-auto-tool-choice``; with a parser but
  without it vLLM answers plain text, and so does this.

When a tool is to be called, the emulated model calls one: the named function,
or for ``"required"`` and ``"auto"`` the first tool.  Under ``"auto"`` it
answers in text instead when the last message is a tool result, so an agent
loop ends after one round trip.  The call's arguments are a schema-shaped
instance of the function's ``parameters`` (``sim.engine.json_schema``).

``response_format``: ``text`` changes nothing; ``json_object`` makes the answer
the JSON object ``{"text": "<generated words>"}``; ``json_schema`` makes it a
schema-shaped instance of the schema.  ``structural_tag`` is refused (the
emulator cannot honour it).  A forced output is turned into tokens up front
(``forced_tokens``) and the engine emits exactly those, so streaming, usage,
``max_tokens`` (truncated JSON, ``finish_reason: "length"``, as in vLLM) and
logprobs all work on them like on sampled words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from core.tokenizer import Tokenizer
from sim.engine.json_schema import SchemaError, instance

# GPT-2-like pieces (a word or one punctuation mark with the whitespace before it).
_PIECE_RE = re.compile(r"\s*(?:[A-Za-z0-9]+|[^\sA-Za-z0-9])|\s+$")
_CHOICE_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


class StructuredError(ValueError):
    """A 400 with vLLM's message; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ToolSupport:
    """vLLM's server flags for tools: ``--tool-call-parser`` and ``--enable-auto-tool-choice``."""

    parser: str | None = None
    auto: bool = False


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the answer will carry, and the ``tool_choice`` that asked for it:
    ``"named"`` ends with finish reason ``stop`` and the others with ``tool_calls``,
    and ``"auto"`` leaves ``content`` null where the others give ``""`` (vLLM's ways)."""

    name: str
    choice: Literal["auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """What the emulated model will write: sampled words (``text is None``), or this text,
    as the arguments of ``tool_call`` when set."""

    text: str | None = None
    tool_call: ToolCall | None = None


@dataclass(frozen=True, slots=True)
class ForcedTokens:
    """Token ids to emit and the text each one adds (concatenated: the whole text)."""

    token_ids: tuple[int, ...]
    pieces: tuple[str, ...]


def plan_chat(body: Mapping[str, Any], tools: ToolSupport, words: Iterator[str]) -> OutputPlan:
    """Validate ``tools``/``tool_choice``/``response_format`` and decide the output."""
    call = _tool_call(body, tools)
    if call is not None:
        function = _function(body["tools"], call.name)
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        return OutputPlan(_json(parameters, words, "tools"), call)
    return plan_format(body, words)


def plan_format(body: Mapping[str, Any], words: Iterator[str]) -> OutputPlan:
    """``response_format`` alone (chat without a tool call, and completions)."""
    spec = body.get("response_format")
    if spec is None:
        return OutputPlan()
    if not isinstance(spec, Mapping):
        raise StructuredError("`response_format` must be an object.", "response_format")
    kind = spec.get("type")
    if kind == "text":
        return OutputPlan()
    if kind == "json_object":
        return OutputPlan(json.dumps({"text": "".join(next(words) for _ in range(6)).strip()}))
    if kind == "json_schema":
        wrapper = spec.get("json_schema")
        if wrapper is None:
            raise StructuredError(
                "When response_format type is 'json_schema', the 'json_schema' field must "
                "be provided.",
                "response_format",
            )
        if not isinstance(wrapper, Mapping) or not isinstance(wrapper.get("name"), str):
            raise StructuredError(
                "`response_format.json_schema` must be an object with a `name`.",
                "response_format",
            )
        return OutputPlan(_json(wrapper.get("schema") or {}, words, "response_format"))
    if kind == "structural_tag":
        raise StructuredError(
            "`response_format` type 'structural_tag' is not supported by the emulated replica.",
            "response_format",
        )
    raise StructuredError(
        "`response_format.type` must be 'text', 'json_object', 'json_schema' or "
        f"'structural_tag', got {kind!r}.",
        "response_format",
    )


def forced_tokens(text: str, tokenizer: Tokenizer) -> ForcedTokens:
    """``text`` as the tokens the engine will emit, each with the text it adds.

    Pieces are encoded one at a time, so each id maps to a known span of text
    whatever the tokenizer; a piece that takes several ids shows its text on the
    last of them.
    """
    ids: list[int] = []
    pieces: list[str] = []
    carried = ""  # pieces that encode to nothing on their own join the next one
    for piece in _PIECE_RE.findall(text):
        encoded = tokenizer.encode(carried + piece)
        if not encoded:
            carried += piece
            continue
        ids += encoded
        pieces += [""] * (len(encoded) - 1) + [carried + piece]
        carried = ""
    if carried and pieces:
        pieces[-1] += carried
    return ForcedTokens(tuple(ids), tuple(pieces))


def _tool_call(body: Mapping[str, Any], support: ToolSupport) -> ToolCall | None:
    tools = body.get("tools")
    if tools == []:
        raise StructuredError(
            "`tools` must not be an empty array. Either provide at least one tool or omit the "
            "field entirely.",
            "tools",
        )
    choice = body.get("tool_choice", "auto" if tools else None)
    if choice is None or choice == "none":
        return None
    if tools is None:
        raise StructuredError("When using `tool_choice`, `tools` must be set.", "tool_choice")
    _check_tools(tools)
    if choice == "auto":
        if support.parser is None or not support.auto:
            if support.parser is not None:
                return None  # a parser without --enable-auto-tool-choice: vLLM answers text
            raise StructuredError(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set"
            )
        return None if _last_role(body) == "tool" else ToolCall(_name(tools[0]), "auto")
    if choice == "required":
        _need_parser(support, '"required"')
        return ToolCall(_name(tools[0]), "required")
    name = _chosen_name(choice, tools)
    _need_parser(support, f'function "{name}"')
    return ToolCall(name, "named")


def _check_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise StructuredError("`tools` must be an array of tools.", "tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (
            not isinstance(function, Mapping)
            or tool.get("type", "function") != "function"
            or not isinstance(function.get("name"), str)
        ):
            raise StructuredError(
                f"`tools[{index}]` must be {{'type': 'function', 'function': {{'name': ...}}}}.",
                "tools",
            )
        if not isinstance(function.get("parameters") or {}, Mapping):
            raise StructuredError(f"`tools[{index}].function.parameters` must be an object.")


def _chosen_name(choice: Any, tools: Sequence[Mapping[str, Any]]) -> str:
    if not isinstance(choice, Mapping):
        raise StructuredError(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" '
            'or "required" are supported.',
            "tool_choice",
        )
    function = choice.get("function")
    if not isinstance(function, Mapping):
        raise StructuredError(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {_CHOICE_USAGE}",
            "tool_choice.function",
        )
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise StructuredError(
            f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_CHOICE_USAGE}",
            "tool_choice.function.name",
        )
    if all(_name(tool) != name for tool in tools):
        raise StructuredError(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            "tool_choice",
        )
    return name


def _need_parser(support: ToolSupport, described: str) -> None:
    if support.parser is None:
        raise StructuredError(f"tool_choice={described} requires --tool-call-parser to be set")


def _name(tool: Mapping[str, Any]) -> str:
    return str(tool["function"]["name"])


def _function(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    return next(t["function"] for t in tools if _name(t) == name)


def _last_role(body: Mapping[str, Any]) -> str | None:
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], Mapping):
        role = messages[-1].get("role")
        return role if isinstance(role, str) else None
    return None


def _json(schema: Any, words: Iterator[str], param: str) -> str:
    if not isinstance(schema, Mapping):
        raise StructuredError("A JSON schema must be an object.", param)
    try:
        return json.dumps(instance(schema, words))
    except SchemaError as exc:
        raise StructuredError(
            f"The emulated replica cannot satisfy this schema: {exc}.", param
        ) from None
