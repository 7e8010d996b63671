"""Parse and validate an OpenAI inference request, and describe it for the policies.

``Endpoint`` lists the inference routes the balancer proxies: vLLM's
OpenAI-compatible POST routes under ``/v1`` (chat, completions, embeddings,
responses, score, rerank).  Each one goes through the same admission, routing,
retries and accounting; they differ only in where the prompt sits in the body
(``_prompt``) and in whether the answer may stream.

The balancer validates only what it needs to route (model, the prompt's shape,
stream flags, max tokens, user); every other field passes through to the
replica, which validates it itself and applies it, as vLLM's OpenAI server
does.  The body a replica receives is the client's own bytes, with one
exception: a streamed chat or completions request always asks for the usage
chunk (``CompletionRequest.upstream_body``).  Validation errors name the
offending ``param`` like api.openai.com so SDK users see which argument was
wrong.

Routing needs the prompt's tokens once: parsing reduces the prompt to a
``core.prompts.Prompt`` (chat messages with the options vLLM's chat
path reads, text, or token ids); the balancer renders and tokenizes it with the
served model's encoder (``prompt_tokens``, possibly in a worker thread), and
``describe`` keys the full blocks under the model's block scheme (its engine's
block size, Meridian's chain or the engine's own hash) with the LoRA adapter as
the extra key, so a key here means the same KV block as the key of a replica's
KV event (``core.block_identity``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from core import errors
from core.block_identity import BlockScheme
from core.length_predictor import prompt_features
from core.openai_inputs import ChatInput, PromptInput, embedding_input, responses_input
from core.prompts import ChatPrompt, Prompt, TextPrompt, TokenPrompt, is_first_turn
from core.types import RequestDescriptor


class Endpoint(Enum):
    """An inference route the balancer proxies; the value is its path."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    EMBEDDINGS = "/v1/embeddings"
    RESPONSES = "/v1/responses"
    SCORE = "/v1/score"
    RERANK = "/v1/rerank"

    @property
    def path(self) -> str:
        return self.value

    @property
    def streams(self) -> bool:
        """Whether ``"stream": true`` makes the answer a server-sent-event stream."""
        return self in (Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.RESPONSES)

    @property
    def usage_on_request(self) -> bool:
        """Whether a stream carries usage only when ``stream_options.include_usage`` asks
        (chat and completions; a Responses stream always ends with its usage)."""
        return self in (Endpoint.CHAT, Endpoint.COMPLETIONS)


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A validated request: what routing needs, plus the payload to send on."""

    endpoint: Endpoint
    model: str
    payload: dict[str, Any]
    prompt: Prompt
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None
    user: str | None
    raw: bytes  # the client's body as received

    def upstream_body(self, priority: int | None = None) -> bytes:
        """The body for a replica: streaming requests always ask for usage, and
        ``priority`` (vLLM's request priority, for engines that schedule by it) is
        added unless the client set its own.

        The balancer learns prompt/cached/completion tokens only from the usage
        chunk (vLLM sends it last when ``stream_options.include_usage`` is set), so
        it asks for it every time and strips it again for clients that did not
        (``core.sse``).  A body that needs no change is sent as received,
        and new fields (a missing ``stream_options``, the priority) are spliced in
        before its closing brace, without re-encoding the JSON (the prompt is most
        of it).
        """
        if priority is not None and "priority" in self.payload:
            priority = None  # the client's own priority stands
        usage = self._needs_usage_option
        if not _plain_utf8(self.raw) or (usage and "stream_options" in self.payload):
            return self._reencoded(priority)
        if not usage and priority is None:
            return self.raw
        # A valid JSON object with at least "model" in it ends in "}".
        spliced = _USAGE_FIELD if usage else b""
        if priority is not None:
            spliced += b', "priority": %d' % priority
        return self.raw.rstrip()[:-1] + spliced + b"}"

    @property
    def _needs_usage_option(self) -> bool:
        return self.stream and not self.client_wants_usage

    def _reencoded(self, priority: int | None) -> bytes:
        # json.loads then json.dumps keeps every field and value (floats round-trip
        # exactly, a repeated key keeps its last value as any JSON reader would).
        payload = self.payload
        if self._needs_usage_option:
            options = dict(payload.get("stream_options") or {})
            options["include_usage"] = True
            payload = {**payload, "stream_options": options}
        if priority is not None:
            payload = {**payload, "priority": priority}
        return json.dumps(payload).encode()


_USAGE_FIELD = b', "stream_options": {"include_usage": true}'


def _plain_utf8(body: bytes) -> bool:
    """UTF-8 without a byte-order mark, the only encoding spliced or passed as is
    (``json.loads`` also reads UTF-16/32, whose first four bytes hold a zero)."""
    return not body.startswith(b"\xef\xbb\xbf") and b"\x00" not in body[:4]


def parse_request(body: bytes, endpoint: Endpoint) -> CompletionRequest:
    """Validate ``body``; raises ``ApiError`` (400) naming the bad parameter."""
    payload = _load_object(body)
    model = payload.get("model")
    if model is None:
        raise errors.missing_parameter("model")
    if not isinstance(model, str):
        raise errors.invalid_type("model", "a string", model)
    if not model.strip():
        raise errors.invalid_value("model", "'model' must not be empty.")
    prompt = _prompt(payload, endpoint)
    # Routes that never stream answer JSON whatever "stream" says: vLLM ignores it there.
    stream = endpoint.streams and _optional_bool(payload, "stream", False)
    wants_usage = _include_usage(payload, stream) if endpoint.usage_on_request else True
    return CompletionRequest(
        endpoint=endpoint,
        model=model,
        payload=payload,
        prompt=prompt,
        stream=stream,
        client_wants_usage=wants_usage,
        max_tokens=_max_tokens(payload, _MAX_TOKENS_FIELDS.get(endpoint, ())),
        user=_optional_str(payload, "user"),
        raw=body,
    )


def describe(
    request: CompletionRequest,
    tokens: Sequence[int],
    *,
    request_id: str,
    session_key: str,
    scheme: BlockScheme,
    forwarded: bool,
    model: str | None = None,
    lora: str | None = None,
) -> RequestDescriptor:
    """The request as the policies see it: its prompt's ``tokens`` (from
    ``core.prompts.prompt_tokens``) keyed in full blocks under ``scheme``.
    A LoRA adapter is part of every block's key, as in the engine: its KV differs
    from the base's.
    ``model`` is the model whose replicas serve it (an adapter's base model)."""
    return RequestDescriptor(
        request_id=request_id,
        model=model or request.model,
        prompt_tokens=len(tokens),
        block_hashes=tuple(scheme.keys(tokens, lora or "")),
        session_key=session_key,
        max_tokens=request.max_tokens,
        lora=lora,
        forwarded=forwarded,
        first_turn=_first_turn(request.prompt),
        # Cues for the response-length predictor: a few words at each end of the
        # last user message, O(1) in the prompt's length.
        features=prompt_features(request.prompt, request.endpoint.name.lower()),
    )


def _first_turn(prompt: Prompt) -> bool:
    """A chat with no reply yet; a completion's text or token ids may hold anything."""
    return isinstance(prompt, ChatPrompt) and is_first_turn(prompt.messages)


def session_key(
    request: CompletionRequest, session_header: str | None, client_address: str | None
) -> str:
    """Sticky-session key: OpenAI ``user``, else ``X-Session-ID``, else the client address."""
    return request.user or session_header or client_address or ""


# How deep a request's JSON may nest.  Real requests stay within a dozen levels
# (messages, content parts, tool schemas); the cap keeps every later walk of the
# payload (chat templates, re-encoding) far from Python's recursion limit.
MAX_JSON_DEPTH = 64

# A JSON escape of a UTF-16 surrogate (D800-DFFF).  Valid UTF-8 bytes cannot
# carry a surrogate, so only an escape can put one in a parsed string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _load_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise errors.invalid_json("the body is empty")
    try:
        payload = json.loads(body)
    except UnicodeDecodeError:
        raise errors.invalid_json("the body is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise errors.invalid_json(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise errors.invalid_json(f"it nests deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(payload, dict):
        raise errors.invalid_json("the top-level value is not an object")
    _check_structure(payload, strings=not _plain_utf8(body) or bool(_SURROGATE_ESCAPE.search(body)))
    return payload


def _check_structure(payload: dict[str, Any], *, strings: bool) -> None:
    """Refuse nesting past ``MAX_JSON_DEPTH`` and, when ``strings``, any string or key
    holding a lone surrogate (it has no UTF-8 form, so no tokenizer or replica can
    read it).  Iterative, so the walk itself cannot overflow the stack."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise errors.invalid_json(f"it nests deeper than {MAX_JSON_DEPTH} levels")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if strings:
                _check_text(key)
                _check_text(item)
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))


def _check_text(value: object) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.invalid_json("a string holds a lone UTF-16 surrogate") from None


def _prompt(payload: Mapping[str, Any], endpoint: Endpoint) -> Prompt:
    """What routing tokenizes: chat messages, text, or the token ids the client sent.

    Score and rerank describe no prompt (``""``): a cross-encoder's input is each
    query paired with each document in the model's own layout, which no block
    hash here would match, so they route on load and session alone.
    """
    match endpoint:
        case Endpoint.CHAT:
            return _chat_prompt(payload)
        case Endpoint.COMPLETIONS:
            return _completion_prompt(payload)
        case Endpoint.EMBEDDINGS:
            # vLLM's embedding chat renders without a generation prompt.
            return _input_prompt(embedding_input(payload), payload, generation_prompt=False)
        case Endpoint.RESPONSES:
            return _input_prompt(responses_input(payload), payload, generation_prompt=True)
        case Endpoint.SCORE | Endpoint.RERANK:
            return TextPrompt("")


def _input_prompt(
    found: ChatInput | PromptInput, payload: Mapping[str, Any], *, generation_prompt: bool
) -> Prompt:
    if isinstance(found, ChatInput):
        if not found.messages:
            raise errors.invalid_value("messages", "'messages' must contain at least one message.")
        messages = _checked_messages(found.messages)
        return ChatPrompt(messages, add_generation_prompt=generation_prompt)
    if found.token_ids is not None:
        return TokenPrompt(checked_token_ids("input", found.token_ids))
    return _completion_prompt({"prompt": found.prompt, **_special_tokens_field(payload)})


def _special_tokens_field(payload: Mapping[str, Any]) -> dict[str, Any]:
    return (
        {"add_special_tokens": payload["add_special_tokens"]}
        if "add_special_tokens" in payload
        else {}
    )


def _chat_prompt(payload: Mapping[str, Any]) -> ChatPrompt:
    """The messages and the chat options vLLM's chat path reads, with vLLM's defaults."""
    messages = payload.get("messages")
    if messages is None:
        raise errors.missing_parameter("messages")
    if not isinstance(messages, list):
        raise errors.invalid_type("messages", "an array", messages)
    if not messages:
        raise errors.invalid_value("messages", "'messages' must contain at least one message.")
    kwargs = payload.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise errors.invalid_type("chat_template_kwargs", "an object", kwargs)
    return ChatPrompt(
        _checked_messages(messages),
        tools=_optional_list(payload, "tools"),
        documents=_optional_list(payload, "documents"),
        add_generation_prompt=_optional_bool(payload, "add_generation_prompt", True),
        continue_final_message=_optional_bool(payload, "continue_final_message", False),
        template_kwargs=kwargs or {},
        add_special_tokens=_optional_bool(payload, "add_special_tokens", False),
    )


def _checked_messages(messages: list[Any]) -> list[dict[str, Any]]:
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise errors.invalid_type(param, "an object", message)
        if not isinstance(message.get("role"), str):
            raise errors.invalid_type(f"{param}.role", "a string", message.get("role"))
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise errors.invalid_type(f"{param}.content", "a string or an array", content)
        if isinstance(content, list) and not all(isinstance(p, dict) for p in content):
            raise errors.invalid_type(f"{param}.content", "an array of content parts", content)
    return messages


def _completion_prompt(payload: Mapping[str, Any]) -> Prompt:
    """``prompt`` as text, or as token ids when the client sent ids (OpenAI allows both)."""
    prompt = payload.get("prompt")
    if prompt is None:
        raise errors.missing_parameter("prompt")
    special = _optional_bool(payload, "add_special_tokens", True)
    if isinstance(prompt, str):
        return TextPrompt(prompt, special)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            # A batch of prompts: route on the first; the replica answers all of them.
            return TextPrompt(str(prompt[0]), special)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return TokenPrompt(checked_token_ids("prompt", prompt))
    raise errors.invalid_type(
        "prompt", "a string, an array of strings or an array of token ids", prompt
    )


# Token ids are hashed as unsigned 32-bit values (``core.blocks``); no
# vocabulary comes near the bound.
MAX_TOKEN_ID = (1 << 32) - 1


def checked_token_ids(param: str, ids: Sequence[int]) -> tuple[int, ...]:
    """``ids`` as a tuple, refusing any outside ``0..MAX_TOKEN_ID``."""
    for index, token in enumerate(ids):
        if not 0 <= token <= MAX_TOKEN_ID:
            raise errors.invalid_value(
                f"{param}[{index}]",
                f"Token ids must be between 0 and {MAX_TOKEN_ID}; got {token}.",
            )
    return tuple(ids)


def _optional_list(payload: Mapping[str, Any], name: str) -> list[Any] | None:
    value = payload.get(name)
    if value is not None and not isinstance(value, list):
        raise errors.invalid_type(name, "an array", value)
    return value


def _optional_bool(payload: Mapping[str, Any], name: str, default: bool) -> bool:
    value = payload.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise errors.invalid_type(name, "a boolean", value)
    return value


def _optional_str(payload: Mapping[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is not None and not isinstance(value, str):
        raise errors.invalid_type(name, "a string", value)
    return value


def _include_usage(payload: Mapping[str, Any], stream: bool) -> bool:
    options = payload.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise errors.invalid_type("stream_options", "an object", options)
    if not stream and options:  # vLLM lets an empty object through, so the balancer does
        raise errors.invalid_value(
            "stream_options", "'stream_options' is only allowed when 'stream' is true."
        )
    value = options.get("include_usage", False)
    if not isinstance(value, bool):
        raise errors.invalid_type("stream_options.include_usage", "a boolean", value)
    return value


# The output cap per route, newest spelling first (OpenAI's API prefers it when both appear).
_MAX_TOKENS_FIELDS = {
    Endpoint.CHAT: ("max_completion_tokens", "max_tokens"),
    Endpoint.COMPLETIONS: ("max_completion_tokens", "max_tokens"),
    Endpoint.RESPONSES: ("max_output_tokens",),
}


def _max_tokens(payload: Mapping[str, Any], names: Sequence[str]) -> int | None:
    for name in names:
        value = payload.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.invalid_type(name, "an integer", value)
        if value < 1:
            raise errors.invalid_value(name, f"'{name}' must be at least 1.")
        return value
    return None
