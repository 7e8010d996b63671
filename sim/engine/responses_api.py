"""``POST /v1/responses`` (OpenAI's Responses API) as vLLM 0.32 serves it, emulated.

Request: ``instructions`` and ``input`` (a string or message items) become chat
messages rendered with the shared template (the same reduction the balancer
routes on, ``core.openai_inputs.responses_input``); ``max_output_tokens``
caps the answer; ``text.format`` (``json_object``/``json_schema``) makes it JSON
as ``response_format`` does for chat.  ``tools``, ``previous_response_id`` and
``background`` are 400s: the emulator cannot honour them (vLLM needs a tool
server and a response store for them).

Answer: a ``response`` object with one assistant ``message`` holding one
``output_text``, ``status: "incomplete"`` with ``incomplete_details.reason:
"max_output_tokens"`` when the cap cut it, and ``usage`` in the Responses
names (``input_tokens``, ``output_tokens``, ``input_tokens_details.cached_tokens``).
A stream is vLLM's event sequence for a text answer, each event as ``event:
TYPE`` plus ``data:``: ``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``,
``response.completed``, numbered by ``sequence_number``.
"""

from __future__ import annotations

import uuid
import zlib
from array import array
from collections.abc import Iterator, Mapping
from typing import Any

from core import errors as routing_errors
from core.openai_inputs import responses_input
from core.tokenizer import Tokenizer, render_chat
from sim.engine.openai_protocol import (
    APIError,
    GenerationRequest,
    body_for_model,
    vocabulary_words,
)
from sim.engine.structured import OutputPlan, StructuredError, forced_tokens, plan_format
from sim.engine.vocab import Vocabulary

_UNHONOURED = ("tools", "previous_response_id", "background")


def parse_responses(
    raw: bytes, *, model: str, tokenizer: Tokenizer, vocab: Vocabulary, max_model_len: int
) -> GenerationRequest:
    """Validate a Responses body into the engine's request; ``APIError`` as vLLM answers."""
    body = body_for_model(raw, model)
    for name in _UNHONOURED:
        if body.get(name):
            raise APIError(f"`{name}` is not supported by the emulated replica.", param=name)
    try:
        messages = responses_input(body).messages
    except routing_errors.ApiError as exc:
        raise APIError(exc.message, param=exc.param) from None
    tokens = tokenizer.encode(render_chat(messages))
    key = f"{zlib.crc32(array('I', tokens).tobytes())}:{len(tokens)}"
    plan = _plan(body, vocabulary_words(vocab, key))
    return GenerationRequest(
        kind="responses",
        model=model,
        prompt_token_ids=tokens,
        max_tokens=_max_output_tokens(body, len(tokens), max_model_len),
        stream=body.get("stream") is True,
        include_usage=True,
        ignore_eos=False,
        seed=None,
        plan=plan,
        forced=None if plan.text is None else forced_tokens(plan.text, tokenizer),
        key=key,
    )


def _plan(body: Mapping[str, Any], words: Iterator[str]) -> OutputPlan:
    text = body.get("text")
    spec = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(spec, Mapping) and spec.get("type") == "json_schema":
        # The Responses API flattens the schema wrapper into ``format``.
        spec = {"type": "json_schema", "json_schema": {**spec, "schema": spec.get("schema")}}
    try:
        return plan_format({"response_format": spec}, words)
    except StructuredError as exc:
        raise APIError(str(exc), param="text.format") from None


def _max_output_tokens(body: Mapping[str, Any], prompt_len: int, max_model_len: int) -> int:
    room = max_model_len - prompt_len
    if room < 1:
        raise APIError(
            f"This model's maximum context length is {max_model_len} tokens, but the input "
            f"has {prompt_len} tokens.",
            param="input",
        )
    value = body.get("max_output_tokens")
    if value is None:
        return room
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise APIError("`max_output_tokens` must be a positive integer.", param="max_output_tokens")
    return value


class ResponsesAnswer:
    """One Responses answer, whole or as its stream of events."""

    def __init__(self, request: GenerationRequest, created: int) -> None:
        self.request = request
        self.created = created
        self.response_id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.sequence = 0
        self.text = ""

    def opening(self) -> list[dict[str, Any]]:
        initial = self._response("in_progress", [], None)
        return [
            self._event("response.created", response=initial),
            self._event("response.in_progress", response=initial),
            self._event(
                "response.output_item.added", output_index=0, item=self._item("in_progress", [])
            ),
            self._event("response.content_part.added", **self._where(), part=self._part("")),
        ]

    def delta(self, text: str) -> dict[str, Any]:
        self.text += text
        return self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])

    def closing(self, finish: str, usage: Mapping[str, Any]) -> list[dict[str, Any]]:
        part = self._part(self.text)
        return [
            self._event("response.output_text.done", **self._where(), text=self.text, logprobs=[]),
            self._event("response.content_part.done", **self._where(), part=part),
            self._event(
                "response.output_item.done", output_index=0, item=self._item("completed", [part])
            ),
            self._event("response.completed", response=self.full(self.text, finish, usage)),
        ]

    def full(self, text: str, finish: str, usage: Mapping[str, Any]) -> dict[str, Any]:
        item = self._item("completed", [self._part(text)])
        status = "incomplete" if finish == "length" else "completed"
        response = self._response(status, [item], _responses_usage(usage))
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response

    def _response(
        self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "model": self.request.model,
            "status": status,
            "incomplete_details": None,
            "error": None,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "max_output_tokens": self.request.max_tokens,
            "usage": usage,
        }

    def _item(self, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.item_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event


def _responses_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    details = usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0)},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }
