"""OpenAI request parsing and response shapes, as vLLM's OpenAI server produces them.

Pure translation between JSON bodies and the engine: no sockets, no asyncio.
Parsing returns a ``GenerationRequest`` or raises ``APIError`` carrying the
status and OpenAI-style error object (``{"error": {message, type, param,
code}}``) that the replica sends back.  Chat messages are rendered with
``routing.core.tokenizer.render_chat`` and tokenized with the shared tokenizer,
so the balancer and the replica count and hash the very same tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from routing.core.tokenizer import Tokenizer, render_chat

Kind = Literal["chat", "completion"]
_MAX_TOKEN_ID = 1 << 32  # block hashing packs ids as unsigned 32-bit integers


class APIError(Exception):
    """An error answer: HTTP status plus the OpenAI error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True)
class GenerationRequest:
    kind: Kind
    model: str
    prompt_token_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    seed: int | None
    lora_name: str = ""
    lora_id: int | None = None


def parse_generation(
    kind: Kind,
    raw: bytes,
    *,
    model: str,
    tokenizer: Tokenizer,
    max_model_len: int,
    loras: Mapping[str, int] | None = None,
) -> GenerationRequest:
    """Validate a ``/v1/chat/completions`` or ``/v1/completions`` body.

    ``model`` may name the base model or one of ``loras`` (adapter name -> id),
    as with vLLM's ``--lora-modules``.
    """
    body = _json_object(raw)
    loras = loras or {}
    requested_model = body.get("model", model)
    if requested_model != model and requested_model not in loras:
        raise APIError(
            f"The model `{requested_model}` does not exist.",
            status=404,
            param="model",
            code="model_not_found",
        )
    if kind == "chat":
        tokens = tokenizer.encode(render_chat(_messages(body)))
    else:
        tokens = _prompt_tokens(body.get("prompt"), tokenizer)
    if not tokens:
        raise APIError("The prompt is empty.", param="prompt")
    stream = _optional(body, "stream", bool, False)
    options = _optional(body, "stream_options", dict, None)
    if options is not None and not stream:
        raise APIError("Stream options can only be defined when `stream=True`.", param="stream")
    if _optional(body, "n", int, 1) != 1:
        raise APIError("Only n=1 is supported.", param="n")
    lora_name = requested_model if requested_model in loras else ""
    return GenerationRequest(
        kind=kind,
        model=requested_model,
        prompt_token_ids=tokens,
        max_tokens=_max_tokens(body, kind, len(tokens), max_model_len),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        ignore_eos=_optional(body, "ignore_eos", bool, False),
        seed=_optional(body, "seed", int, None),
        lora_name=lora_name,
        lora_id=loras.get(lora_name),
    )


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.")
    return body


def _optional(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    # bool is an int subclass; "max_tokens": true must not pass as 1.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise APIError(f"`{name}` must be of type {kind.__name__}.", param=name)
    return value


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("`messages` must be a non-empty list.", param="messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise APIError("Each message must be an object with a `role`.", param="messages")
    try:
        render_chat(messages)
    except ValueError as exc:
        raise APIError(str(exc), param="messages") from None
    return messages


def _prompt_tokens(prompt: Any, tokenizer: Tokenizer) -> list[int]:
    """A prompt string, a one-string list, or a list of token ids."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < _MAX_TOKEN_ID for t in prompt
    ):
        return list(prompt)
    raise APIError(
        "`prompt` must be a string or a list of token ids (batched prompts are not supported).",
        param="prompt",
    )


def _max_tokens(body: dict[str, Any], kind: Kind, prompt_len: int, max_model_len: int) -> int:
    name = "max_tokens"
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        name = "max_completion_tokens"  # the newer spelling wins, as in OpenAI's API
    value = _optional(body, name, int, None)
    room = max_model_len - prompt_len
    if room < 1:
        raise APIError(
            f"This model's maximum context length is {max_model_len} tokens, "
            f"but the prompt has {prompt_len} tokens.",
            param="messages" if kind == "chat" else "prompt",
        )
    if value is None:
        return room  # vLLM's default: whatever context is left
    if value < 1:
        raise APIError(f"`{name}` must be at least 1, got {value}.", param=name)
    return int(value)


# -- responses ---------------------------------------------------------------
def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def stream_chunk(
    kind: Kind, request_id: str, created: int, model: str, text: str | None, finish: str | None
) -> dict[str, Any]:
    """One SSE chunk; for chat, ``text=None`` is the opening chunk carrying the role."""
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "stop_reason": None}
        obj = "text_completion"
    choice.update(logprobs=None, finish_reason=finish)
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
    }


def usage_chunk(
    kind: Kind, request_id: str, created: int, model: str, usage_: dict[str, Any]
) -> dict[str, Any]:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def full_response(
    kind: Kind,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    usage_: dict[str, Any],
) -> dict[str, Any]:
    if kind == "chat":
        message = {"role": "assistant", "content": text, "tool_calls": []}
        choice: dict[str, Any] = {"index": 0, "message": message}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text}
        obj = "text_completion"
    choice.update(logprobs=None, finish_reason=finish, stop_reason=None)
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_,
    }


def models_list(
    model: str, created: int, max_model_len: int, loras: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The base model, then each LoRA adapter with the base as its parent (as vLLM lists)."""
    cards = [(model, None)] + [(name, model) for name in (loras or {})]
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": name,
            "parent": parent,
            "max_model_len": max_model_len,
        }
        for name, parent in cards
    ]
    return {"object": "list", "data": data}
