"""Where the prompt sits in the bodies of the Embeddings and Responses APIs.

Chat and completions keep their prompt in ``messages`` and ``prompt``
(``core.openai_request``).  The other inference routes carry it in
shapes of their own, which this module reduces to one of those two, so the
balancer renders and tokenizes every route's prompt the same way:

* ``/v1/embeddings``: ``input`` is text, a list of texts, a list of token ids,
  a list of such lists, or (vLLM) a list of chat messages; vLLM also takes the
  messages as ``messages``.  A batch routes on its first entry.
* ``/v1/responses``: ``instructions`` (a system message) and ``input``, a
  string or a list of items; message items count with their text parts, other
  items (tool calls and their outputs, reasoning) add nothing to the prefix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core import errors

_INPUT_SHAPES = "a string, an array of strings, an array of token ids or an array of such arrays"


@dataclass(frozen=True, slots=True)
class ChatInput:
    """A prompt given as chat messages, to render like a chat request's."""

    messages: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class PromptInput:
    """A prompt given as text (``prompt``) or as token ids (``token_ids``)."""

    prompt: str = ""
    token_ids: tuple[int, ...] | None = None


def embedding_input(payload: Mapping[str, Any]) -> ChatInput | PromptInput:
    """The first prompt of an embeddings request; ``ApiError`` (400) naming ``input``."""
    if "input" not in payload and "messages" in payload:
        messages = payload["messages"]
        if not isinstance(messages, list):
            raise errors.invalid_type("messages", "an array", messages)
        return ChatInput(messages)
    given = payload.get("input")
    if given is None:
        raise errors.missing_parameter("input")
    if isinstance(given, str):
        return PromptInput(given)
    if not isinstance(given, list) or not given:
        raise errors.invalid_type("input", _INPUT_SHAPES, given)
    if all(_is_message(item) for item in given):
        return ChatInput(given)
    if all(isinstance(item, str) for item in given):
        return PromptInput(given[0])
    if _is_token_ids(given):
        return PromptInput(token_ids=tuple(given))
    if all(_is_token_ids(item) for item in given):
        return PromptInput(token_ids=tuple(given[0]))
    raise errors.invalid_type("input", _INPUT_SHAPES, given)


def responses_input(payload: Mapping[str, Any]) -> ChatInput:
    """A Responses request's ``instructions`` and ``input`` as chat messages."""
    given = payload.get("input")
    if given is None:
        raise errors.missing_parameter("input")
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise errors.invalid_type("instructions", "a string", instructions)
    messages = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(given, str):
        return ChatInput([*messages, {"role": "user", "content": given}])
    if not isinstance(given, list):
        raise errors.invalid_type("input", "a string or an array of input items", given)
    for index, item in enumerate(given):
        if not isinstance(item, dict):
            raise errors.invalid_type(f"input[{index}]", "an object", item)
        if _is_message(item):
            messages.append({"role": item["role"], "content": _item_text(item.get("content"))})
    if not messages:
        raise errors.invalid_value("input", "'input' must contain at least one message.")
    return ChatInput(messages)


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str)


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _item_text(content: Any) -> str:
    """The text of a Responses message's content: a string or typed text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        str(part.get("text", ""))
        for part in content
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
    )
