"""``POST /v1/responses`` of an emulated generative replica.

Parsing and the response and event shapes are ``sim.engine.responses_api``;
this is the HTTP handler around them.  The generation runs in the engine like
a chat request (queued, batched, prefix-cached, aborted when the client
leaves); a stream sends vLLM's Responses events as ``event:``/``data:`` pairs.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from core.tokenizer import Tokenizer
from sim.asgi_io import Driver, Receive, Send, drain, send_json, start, until_disconnect
from sim.engine import EngineRequest, RequestOutput, Vocabulary
from sim.engine.openai_answers import Answer, usage
from sim.engine.openai_protocol import APIError, GenerationRequest
from sim.engine.responses_api import ResponsesAnswer, parse_responses


class ResponsesEndpoint:
    """The handler: ``await endpoint(body, receive, send)``."""

    def __init__(
        self,
        driver: Driver,
        *,
        model: str,
        tokenizer: Tokenizer,
        vocab: Vocabulary,
        max_model_len: int,
    ) -> None:
        self.driver = driver
        self.model = model
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.max_model_len = max_model_len

    async def __call__(self, body: bytes, receive: Receive, send: Send) -> None:
        try:
            request = parse_responses(
                body, model=self.model, tokenizer=self.tokenizer, vocab=self.vocab,
                max_model_len=self.max_model_len,
            )  # fmt: skip
            engine_id = f"resp-{uuid.uuid4().hex}"
            forced = list(request.forced.token_ids) if request.forced else None
            engine_request = EngineRequest(
                engine_id, request.prompt_token_ids, request.max_tokens, output_token_ids=forced
            )
            try:
                queue = self.driver.submit(engine_request)
            except ValueError as exc:  # the engine's own limits (context length)
                raise APIError(str(exc)) from None
        except APIError as exc:
            await send_json(send, exc.status, exc.body)
            return
        respond = self._stream if request.stream else self._complete
        try:
            await until_disconnect(receive, respond(request, queue, send))
        finally:
            self.driver.abort(engine_id)

    async def _complete(
        self, request: GenerationRequest, queue: asyncio.Queue[RequestOutput], send: Send
    ) -> None:
        tokens: list[int] = []
        while True:
            output = await queue.get()
            tokens += output.new_token_ids
            if output.finish_reason is not None:
                break
        text = Answer(request, "", 0, self.vocab).text(tokens)
        counted = usage(output.prompt_tokens, output.completion_tokens, output.cached_tokens)
        answer = ResponsesAnswer(request, int(time.time()))
        await send_json(send, 200, answer.full(text, output.finish_reason.value, counted))

    async def _stream(
        self, request: GenerationRequest, queue: asyncio.Queue[RequestOutput], send: Send
    ) -> None:
        answer = ResponsesAnswer(request, int(time.time()))
        texts = Answer(request, "", 0, self.vocab)
        await send(start(200, "text/event-stream; charset=utf-8"))
        last = None
        while last is None or last.finish_reason is None:
            outputs = await drain(queue)
            if last is None:  # after prefill, as vLLM's first events follow the first output
                for event in answer.opening():
                    await _event(send, event)
            last = outputs[-1]
            text = texts.text([token for output in outputs for token in output.new_token_ids])
            if text:
                await _event(send, answer.delta(text))
        counted = usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
        assert last.finish_reason is not None
        for event in answer.closing(last.finish_reason.value, counted):
            await _event(send, event)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _event(send: Send, event: dict[str, Any]) -> None:
    data = json.dumps(event, separators=(",", ":"))
    frame = f"event: {event['type']}\ndata: {data}\n\n".encode()
    await send({"type": "http.response.body", "body": frame, "more_body": True})
