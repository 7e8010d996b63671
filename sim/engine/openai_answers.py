"""The response objects of one generation, built as the engine's tokens arrive.

``Answer`` turns engine outputs (token ids and a finish reason) into vLLM's
chat and completions objects, streamed chunk by chunk or whole: the text of
each token (a vocabulary word, or the piece of a forced structured output),
its logprobs when asked, and a tool call where the request's plan has one.

A tool call streams as vLLM's named-tool path does: the first delta carries
the call's ``id``, ``type`` and function ``name`` with the first arguments
text, later deltas only ``arguments``; the final chunk's ``finish_reason`` is
``tool_calls`` (``stop`` for a named ``tool_choice``), or ``length`` when
``max_tokens`` cut the arguments short.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sim.engine.logprobs import TokenLogprobs, chat_logprobs, completion_logprobs, token_logprobs
from sim.engine.openai_protocol import GenerationRequest
from sim.engine.vocab import Vocabulary


class Answer:
    """One request's response objects; feed it the engine's tokens in order."""

    def __init__(
        self, request: GenerationRequest, request_id: str, created: int, vocab: Vocabulary
    ) -> None:
        self.request = request
        self.request_id = request_id
        self.created = created
        self.vocab = vocab
        self.position = 0  # tokens rendered so far
        self.text_offset = 0
        call = request.plan.tool_call
        self.tool_call_id = f"chatcmpl-tool-{uuid.uuid4().hex}" if call else None
        self._tool_started = False

    # -- streaming ---------------------------------------------------------------
    def opening(self) -> dict[str, Any]:
        """Chat's first chunk, the role; vLLM sends it with the first engine output."""
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}}, None)

    def chunk(self, token_ids: Sequence[int], finish: str | None) -> dict[str, Any]:
        text, logprobs = self._advance(token_ids)
        if self.request.kind != "chat":
            choice = {"index": 0, "text": text, "stop_reason": None}
            return self._chunk(choice, self._completion_logprobs(logprobs, text), finish)
        delta: dict[str, Any] = {"content": text}
        if self.tool_call_id is not None:
            delta = {"tool_calls": [self._tool_delta(text)]}
        choice = {"index": 0, "delta": delta}
        return self._chunk(choice, self._chat_logprobs(logprobs), finish)

    def usage_chunk(self, usage: Mapping[str, Any]) -> dict[str, Any]:
        return {**self._envelope(), "choices": [], "usage": dict(usage)}

    # -- whole -------------------------------------------------------------------
    def full(
        self, token_ids: Sequence[int], finish: str, usage: Mapping[str, Any]
    ) -> dict[str, Any]:
        text, logprobs = self._advance(token_ids)
        if self.request.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "message": self._message(text)}
            choice["logprobs"] = self._chat_logprobs(logprobs)
        else:
            choice = {"index": 0, "text": text}
            choice["logprobs"] = self._completion_logprobs(logprobs, text)
        choice.update(finish_reason=self._finish(finish), stop_reason=None)
        envelope = self._envelope()
        envelope["object"] = "chat.completion" if self.request.kind == "chat" else "text_completion"
        return {**envelope, "choices": [choice], "usage": dict(usage)}

    def text(self, token_ids: Sequence[int]) -> str:
        """The text of the next ``token_ids``, for answers shaped elsewhere (Responses)."""
        return self._advance(token_ids)[0]

    # -- pieces ------------------------------------------------------------------
    def _advance(self, token_ids: Sequence[int]) -> tuple[str, list[TokenLogprobs]]:
        """The text of the next ``token_ids`` and, when asked, their logprobs."""
        texts = [self._token_text(self.position + i, t) for i, t in enumerate(token_ids)]
        logprobs = []
        k = self.request.logprobs
        if k is not None:
            for i, (token_id, text) in enumerate(zip(token_ids, texts, strict=True)):
                found = token_logprobs(
                    self.request.key, self.position + i, token_id, text, k,
                    self.vocab.token_ids, self._word,
                )  # fmt: skip
                logprobs.append(found)
        self.position += len(token_ids)
        return "".join(texts), logprobs

    def _token_text(self, position: int, token_id: int) -> str:
        forced = self.request.forced
        if forced is not None and position < len(forced.pieces):
            return forced.pieces[position]
        return self._word(token_id)

    def _word(self, token_id: int) -> str:
        return self.vocab.text([token_id])

    def _message(self, text: str) -> dict[str, Any]:
        call = self.request.plan.tool_call
        if call is None:
            return {"role": "assistant", "content": text, "tool_calls": []}
        function = {"name": call.name, "arguments": text}
        tool = {"id": self.tool_call_id, "type": "function", "function": function}
        # vLLM: null content beside an "auto" call, "" beside a forced one.
        content = None if call.choice == "auto" else ""
        return {"role": "assistant", "content": content, "tool_calls": [tool]}

    def _tool_delta(self, text: str) -> dict[str, Any]:
        call = self.request.plan.tool_call
        assert call is not None
        if self._tool_started:
            return {"index": 0, "function": {"arguments": text}}
        self._tool_started = True
        function = {"name": call.name, "arguments": text}
        return {"index": 0, "id": self.tool_call_id, "type": "function", "function": function}

    def _finish(self, finish: str | None) -> str | None:
        call = self.request.plan.tool_call
        if finish == "stop" and call is not None and call.choice != "named":
            return "tool_calls"
        return finish

    def _chat_logprobs(self, tokens: list[TokenLogprobs]) -> dict[str, Any] | None:
        return None if self.request.logprobs is None else chat_logprobs(tokens)

    def _completion_logprobs(self, tokens: list[TokenLogprobs], text: str) -> Any:
        if self.request.logprobs is None:
            return None
        found = completion_logprobs(tokens, self.text_offset)
        self.text_offset += len(text)
        return found

    def _chunk(
        self, choice: dict[str, Any], logprobs: Any, finish: str | None = None
    ) -> dict[str, Any]:
        choice.update(logprobs=logprobs, finish_reason=self._finish(finish))
        return {**self._envelope(), "choices": [choice]}

    def _envelope(self) -> dict[str, Any]:
        chat = self.request.kind == "chat"
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": self.request.model,
        }


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
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
