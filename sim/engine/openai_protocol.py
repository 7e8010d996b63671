"""OpenAI request parsing and response shapes, as vLLM's OpenAI server produces them.

Pure translation between JSON bodies and the engine: no sockets, no asyncio.
Parsing returns a ``GenerationRequest`` or raises ``APIError`` carrying the
status and OpenAI-style error object (``{"error": {message, type, param,
code}}``) that the replica sends back.  Chat messages are rendered with
``core.tokenizer.render_chat`` and tokenized with the shared tokenizer,
so the balancer and the replica count and hash the very same tokens; a replica
given the model's tokenizer files (``--tokenizer DIR``) passes its
``ModelTokenizer`` as ``encoder`` instead, and chat and completions are then
rendered and tokenized the way vLLM does with that model (chat template, and
``add_special_tokens`` false for chat, true for completions, unless the request
says otherwise).

Fields that shape the answer are honoured or refused, never dropped:
``logprobs``/``top_logprobs`` (``sim.engine.logprobs``), ``tools``,
``tool_choice`` and ``response_format`` (``sim.engine.structured``) are
honoured as vLLM does; ``n > 1`` and the fields in ``_UNHONOURED`` get a 400.
Other fields (sampling knobs such as ``temperature``) change nothing here, as
an emulated model's words are random anyway.
"""

from __future__ import annotations

import json
import random
import zlib
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from core.chat_template import TemplateError
from core.prompts import ChatPrompt, PromptEncoder, TextPrompt, prompt_tokens
from core.tokenizer import Tokenizer, render_chat
from sim.engine.logprobs import DEFAULT_MAX_LOGPROBS
from sim.engine.structured import (
    ForcedTokens,
    OutputPlan,
    StructuredError,
    ToolSupport,
    forced_tokens,
    plan_chat,
    plan_format,
)
from sim.engine.vocab import Vocabulary

Kind = Literal["chat", "completion", "responses"]
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
    # Alternatives per token when logprobs were asked for (chat: top_logprobs).
    logprobs: int | None = None
    plan: OutputPlan = field(default_factory=OutputPlan)
    forced: ForcedTokens | None = None  # the plan's text as the tokens to emit
    key: str = ""  # what the emulated logprobs are derived from: same request, same numbers
    # vLLM's request priority (lower first), which only an engine that schedules by
    # priority reads.
    priority: int = 0


@dataclass(frozen=True)
class ServerOptions:
    """The vLLM server flags that change how requests are answered."""

    tools: ToolSupport = field(default_factory=ToolSupport)
    max_logprobs: int = DEFAULT_MAX_LOGPROBS


# Fields vLLM honours that would change the answer's shape, which the emulator cannot.
_UNHONOURED = (
    "echo",
    "prompt_logprobs",
    "use_beam_search",
    "structured_outputs",
    "logprob_token_ids",
    "return_token_ids",
)


def parse_generation(
    kind: Kind,
    raw: bytes,
    *,
    model: str,
    tokenizer: Tokenizer,
    vocab: Vocabulary,
    max_model_len: int,
    loras: Mapping[str, int] | None = None,
    server: ServerOptions | None = None,
    encoder: PromptEncoder | None = None,
) -> GenerationRequest:
    """Validate a ``/v1/chat/completions`` or ``/v1/completions`` body.

    ``model`` may name the base model or one of ``loras`` (adapter name -> id),
    as with vLLM's ``--lora-modules``.  ``encoder``: the model's own tokenizer and
    chat template, when the replica has them.
    """
    server = server or ServerOptions()
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
    if encoder is not None:
        tokens = _model_tokens(kind, body, encoder, tokenizer)
    elif kind == "chat":
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
    for name in _UNHONOURED:
        if body.get(name):
            raise APIError(f"`{name}` is not supported by the emulated replica.", param=name)
    lora_name = requested_model if requested_model in loras else ""
    seed = _optional(body, "seed", int, None)
    key = f"{seed}:{zlib.crc32(array('I', tokens).tobytes())}:{len(tokens)}"
    plan = _plan(kind, body, server.tools, vocabulary_words(vocab, key))
    return GenerationRequest(
        kind=kind,
        model=requested_model,
        prompt_token_ids=tokens,
        max_tokens=_max_tokens(body, kind, len(tokens), max_model_len),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        ignore_eos=_optional(body, "ignore_eos", bool, False),
        seed=seed,
        lora_name=lora_name,
        lora_id=loras.get(lora_name),
        logprobs=_logprobs(kind, body, server.max_logprobs, len(vocab)),
        plan=plan,
        forced=None if plan.text is None else forced_tokens(plan.text, tokenizer),
        key=key,
        priority=_optional(body, "priority", int, 0),
    )


def _plan(kind: Kind, body: dict[str, Any], tools: ToolSupport, words: Iterator[str]) -> OutputPlan:
    try:
        return plan_chat(body, tools, words) if kind == "chat" else plan_format(body, words)
    except StructuredError as exc:
        raise APIError(str(exc), param=exc.param) from None


def vocabulary_words(vocab: Vocabulary, key: str) -> Iterator[str]:
    """Vocabulary words for the strings of a structured answer, fixed by the request."""
    rng = random.Random(key)
    while True:
        yield vocab.text([vocab.token_ids[rng.randrange(len(vocab))]])


def _logprobs(kind: Kind, body: dict[str, Any], max_logprobs: int, vocab_size: int) -> int | None:
    """Alternatives per token, or None; vLLM's checks and messages (-1: the vocabulary)."""
    if kind == "chat":
        wanted = _optional(body, "logprobs", bool, False)
        top = _logprob_count(body, "top_logprobs")
        if top is not None and top != 0 and not wanted:
            raise APIError(
                "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs"
            )
        count = (top or 0) if wanted else None
    else:
        count = _logprob_count(body, "logprobs")
    if count == -1:
        count = vocab_size
    if count is not None and count > max_logprobs:
        raise APIError(
            f"Requested sample logprobs of {count}, which is greater than max allowed: "
            f"{max_logprobs}",
            param="logprobs",
        )
    return count


def _logprob_count(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(f"`{name}` must be an integer.", param=name)
    if value < 0 and value != -1:
        raise APIError(f"`{name}` must be a positive value or -1.", param=name)
    return value


def body_for_model(raw: bytes, model: str) -> dict[str, Any]:
    """A request body that is a JSON object naming this replica's ``model`` (or none):
    ``APIError`` as vLLM answers otherwise (400, or 404 ``model_not_found``)."""
    body = _json_object(raw)
    requested = body.get("model") or model
    if requested != model:
        raise APIError(
            f"The model `{requested}` does not exist.",
            status=404,
            param="model",
            code="model_not_found",
        )
    return body


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


def _model_tokens(
    kind: Kind, body: dict[str, Any], encoder: PromptEncoder, tokenizer: Tokenizer
) -> list[int]:
    """The prompt's ids under the model's own tokenizer and chat template (vLLM's way)."""
    if kind != "chat":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return _prompt_tokens(prompt, tokenizer)  # token ids, used as they are
        special = _optional(body, "add_special_tokens", bool, True)
        return list(prompt_tokens(TextPrompt(prompt, add_special_tokens=special), encoder))
    kwargs = _optional(body, "chat_template_kwargs", dict, {})
    chat = ChatPrompt(
        _messages(body),
        tools=_optional(body, "tools", list, None),
        documents=_optional(body, "documents", list, None),
        add_generation_prompt=_optional(body, "add_generation_prompt", bool, True),
        continue_final_message=_optional(body, "continue_final_message", bool, False),
        template_kwargs=kwargs,
        add_special_tokens=_optional(body, "add_special_tokens", bool, False),
    )
    try:
        return list(prompt_tokens(chat, encoder))
    except TemplateError as exc:  # vLLM answers a template's refusal with a 400
        raise APIError(f"The chat template refused the messages: {exc}", param="messages") from None


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
