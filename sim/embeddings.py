"""``POST /v1/embeddings`` of an emulated pooling replica (``--runner pooling``).

Parsing, vectors and the response shape are ``sim.engine.pooling``; this is
the HTTP handler around them.  Each input is its own pooling request in the
engine, as vLLM schedules them: it waits, is batched and prefilled (finding
its prefix in the cache, so ``vllm:prefix_cache_hits_total`` counts it) like
any other request, and finishes at the end of its prefill.  A client that
leaves aborts every input still in the engine.
"""

from __future__ import annotations

import time
import uuid

from core.tokenizer import Tokenizer
from sim.asgi_io import Driver, Receive, Send, send_json, until_disconnect
from sim.engine import EngineRequest, pooling
from sim.engine.openai_protocol import APIError


class EmbeddingsEndpoint:
    """The handler: ``await endpoint(body, receive, send)``."""

    def __init__(
        self,
        driver: Driver,
        *,
        model: str,
        tokenizer: Tokenizer,
        max_model_len: int,
        embedding_size: int,
    ) -> None:
        self.driver = driver
        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.embedding_size = embedding_size

    async def __call__(self, body: bytes, receive: Receive, send: Send) -> None:
        try:
            request = pooling.parse_embedding(
                body,
                model=self.model,
                tokenizer=self.tokenizer,
                max_model_len=self.max_model_len,
            )
        except APIError as exc:
            await send_json(send, exc.status, exc.body)
            return
        request_id = f"embd-{uuid.uuid4().hex}"
        ids = [f"{request_id}-{index}" for index in range(len(request.inputs))]
        try:
            await until_disconnect(receive, self._embed(request, request_id, ids, send))
        finally:
            for engine_id in ids:
                self.driver.abort(engine_id)  # a no-op for the finished ones

    async def _embed(
        self, request: pooling.EmbeddingRequest, request_id: str, ids: list[str], send: Send
    ) -> None:
        queues = [
            self.driver.submit(EngineRequest(engine_id, tokens, 1, pooling=True))
            for engine_id, tokens in zip(ids, request.inputs, strict=True)
        ]
        for queue in queues:
            while (await queue.get()).finish_reason is None:
                pass
        vectors = [pooling.embed(tokens, self.embedding_size) for tokens in request.inputs]
        prompt_tokens = sum(len(tokens) for tokens in request.inputs)
        response = pooling.embedding_response(
            request_id, int(time.time()), request.model, vectors, request.encoding_format,
            prompt_tokens,
        )  # fmt: skip
        await send_json(send, 200, response)
