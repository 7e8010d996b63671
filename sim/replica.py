"""One emulated vLLM replica as a plain ASGI application.

``EngineDriver`` runs the pure ``Engine`` in real time: while there is work it
calls ``step()``, sleeps the step's modeled duration times ``time_scale`` and
then hands each request its new tokens; with no work it waits on an event, so
an idle replica costs no CPU.  ``Replica`` is the HTTP face, speaking vLLM's
OpenAI-compatible API (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health``, ``/metrics``) plus two operator hooks:
``/fault`` for failure drills and vLLM's ``/reset_prefix_cache``; and, for the
KV-event consumer, vLLM's ``GET /kv_event_sources`` (where it publishes and
replays, ``{}`` without a publisher) and ``GET /kv_cache/blocks`` (its cached
block hashes, for anti-entropy; an emulator extension).

Every generation is raced against the client's ``http.disconnect``: when the
client goes away, during prefill or decode, streaming or not, the request is
aborted in the engine, its blocks freed and it is counted with
``finished_reason="abort"`` (vLLM behaves the same), so running + waiting
drain back to zero.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from core.prompts import PromptEncoder
from core.tokenizer import Tokenizer
from sim.asgi_io import (
    Receive,
    Scope,
    Send,
    drain,
    read_body,
    send_bytes,
    send_json,
    send_sse,
    start,
    until_disconnect,
)
from sim.embeddings import EmbeddingsEndpoint
from sim.engine import Engine, EngineRequest, RequestOutput, pooling
from sim.engine import openai_protocol as api
from sim.engine.openai_answers import Answer, models_list, usage
from sim.engine.prometheus import LoraInfoGauge, render_metrics
from sim.kv_events import KVEventPublisher, cache_snapshot
from sim.responses import ResponsesEndpoint

Handler = Callable[[bytes, Receive, Send], Awaitable[None]]

FAULT_MODES = ("none", "die", "hang", "slow", "reject", "busy")
# What the ``busy`` fault makes late: the status pages a probe reads, not generation.
STATUS_ROUTES = frozenset({"/health", "/metrics", "/v1/models"})
Runner = Literal["generate", "pooling"]
DEBUG_LOG_SIZE = 64
logger = logging.getLogger(__name__)


class EngineDriver:
    """Steps an engine in scaled real time and routes its outputs to waiting requests."""

    def __init__(
        self, engine: Engine, *, time_scale: float, publisher: KVEventPublisher | None = None
    ) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.publisher = publisher
        self.paused = False
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started = time.monotonic()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        if self.publisher is not None:
            self.publisher.start_replay()

    async def stop(self) -> None:
        self.abort_all()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.publisher is not None:
            await self.publisher.close()

    def submit(self, request: EngineRequest) -> asyncio.Queue[RequestOutput]:
        """Queue ``request``; its outputs arrive on the returned queue.  ValueError if invalid."""
        if not self.engine.has_work():
            # Idle wall time passes on the modeled clock too; while busy the clock
            # is driven by step times alone, so latencies stay modeled, not measured.
            self.engine.advance_clock((time.monotonic() - self._started) / self.time_scale)
        self.engine.add_request(request)
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request.request_id] = queue
        self._wake.set()
        return queue

    def abort(self, request_id: str) -> None:
        """Abort a request if the engine still has it (a no-op once it finished)."""
        output = self.engine.abort(request_id)
        queue = self._streams.pop(request_id, None)
        if output is not None and queue is not None:
            queue.put_nowait(output)

    def abort_all(self) -> None:
        for request_id in list(self.engine.requests):
            self.abort(request_id)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self._wake.set()

    async def _run(self) -> None:
        while True:
            if self.paused or not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            result = self.engine.step()
            # Tokens exist only once the forward pass is over: sleep first, then deliver.
            await asyncio.sleep(result.duration_s * self.time_scale)
            for output in result.outputs:
                self._deliver(output)
            events = self.engine.events.drain()
            if self.publisher is not None:
                self.publisher.publish(events)

    def _deliver(self, output: RequestOutput) -> None:
        if output.finish_reason is None:
            queue = self._streams.get(output.request_id)
        else:
            queue = self._streams.pop(output.request_id, None)
        if queue is not None:  # None: aborted while the step was running
            queue.put_nowait(output)


class Replica:
    """The ASGI application of one replica: OpenAI API, metrics, health and faults."""

    def __init__(
        self,
        name: str,
        *,
        engine: Engine,
        model: str,
        tokenizer: Tokenizer,
        time_scale: float,
        publisher: KVEventPublisher | None = None,
        loras: dict[str, int] | None = None,
        runner: Runner = "generate",
        server: api.ServerOptions | None = None,
        embedding_size: int = pooling.DEFAULT_EMBEDDING_SIZE,
        encoder: PromptEncoder | None = None,
    ) -> None:
        self.name = name
        # The model's own tokenizer and chat template (--tokenizer DIR), for chat and
        # completions; None: the shared tokenizer and Meridian's fixed template.
        self.encoder = encoder
        self.engine = engine
        self.model = model
        self.loras = loras or {}
        self.lora_info = LoraInfoGauge() if self.loras else None
        self.server = server or api.ServerOptions()
        self.received: deque[dict[str, Any]] = deque(maxlen=DEBUG_LOG_SIZE)
        self.tokenizer = tokenizer
        self.driver = EngineDriver(engine, time_scale=time_scale, publisher=publisher)
        self.fault = "none"
        self.slow_factor = 1.0
        # Seconds the status pages answer late under the ``busy`` fault.
        self.status_lag_s = 0.0
        self.on_die: Callable[[], None] = lambda: None
        self._unhung = asyncio.Event()
        self._unhung.set()
        self._created = int(time.time())
        self._routes: dict[tuple[str, str], Handler] = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/models"): self._models,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/fault"): self._get_fault,
            ("POST", "/fault"): self._post_fault,
            ("POST", "/reset_prefix_cache"): self._reset_prefix_cache,
            ("GET", "/kv_event_sources"): self._kv_event_sources,
            ("GET", "/kv_cache/blocks"): self._kv_cache_blocks,
            ("GET", "/debug/requests"): self._debug_requests,
        }
        # vLLM registers the generation routes for a generative model and the
        # embeddings route for a pooling one; the other kind's routes are 404s.
        if runner == "generate":
            self._routes[("POST", "/v1/chat/completions")] = self._chat
            self._routes[("POST", "/v1/completions")] = self._completion
            self._routes[("POST", "/v1/responses")] = ResponsesEndpoint(
                self.driver, model=model, tokenizer=tokenizer, vocab=engine.vocab,
                max_model_len=engine.max_model_len,
            )  # fmt: skip
        else:
            endpoint = EmbeddingsEndpoint(
                self.driver, model=model, tokenizer=tokenizer,
                max_model_len=engine.max_model_len, embedding_size=embedding_size,
            )  # fmt: skip
            self._routes[("POST", "/v1/embeddings")] = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.fault == "die":
            return
        body = await read_body(receive)
        if body is None:
            return
        path, method = scope["path"], scope["method"]
        if method == "POST":
            self._remember(scope, body)
        if path != "/fault":  # the drill must always be able to clear a fault
            if self.fault == "hang" and not await until_disconnect(receive, self._unhung.wait()):
                return
            if (
                self.fault == "busy"
                and path in STATUS_ROUTES
                and not await until_disconnect(receive, asyncio.sleep(self.status_lag_s))
            ):
                return
            if self.fault == "reject":
                error = api.APIError(f"replica {self.name} is rejecting requests", status=503)
                await send_json(send, 503, error.body | {"replica": self.name})
                return
        handler = self._routes.get((method, path))
        if handler is not None:
            await handler(body, receive, send)
        elif any(route_path == path for _, route_path in self._routes):
            await send_json(send, 405, {"detail": "Method Not Allowed"})
        else:
            await send_json(send, 404, {"detail": "Not Found"})

    # -- plain endpoints ----------------------------------------------------
    async def _health(self, body: bytes, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, b"", "text/plain")

    async def _models(self, body: bytes, receive: Receive, send: Send) -> None:
        cards = models_list(self.model, self._created, self.engine.max_model_len, self.loras)
        await send_json(send, 200, cards)

    def _remember(self, scope: Scope, body: bytes) -> None:
        headers = dict(scope.get("headers") or [])
        self.received.append(
            {
                "path": scope["path"],
                "request_id": headers.get(b"x-request-id", b"").decode(errors="replace"),
                "body": body.decode(errors="replace"),
            }
        )

    async def _debug_requests(self, body: bytes, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"replica": self.name, "requests": list(self.received)})

    async def _metrics(self, body: bytes, receive: Receive, send: Send) -> None:
        text = render_metrics(self.engine, self.model, self.lora_info)
        await send_bytes(send, 200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    async def _reset_prefix_cache(self, body: bytes, receive: Receive, send: Send) -> None:
        if not self.engine.reset_prefix_cache():
            await send_json(send, 409, api.APIError("blocks are in use", status=409).body)
            return
        if self.driver.publisher is not None:
            self.driver.publisher.publish(self.engine.events.drain())
        await send_bytes(send, 200, b"", "text/plain")

    async def _kv_event_sources(self, body: bytes, receive: Receive, send: Send) -> None:
        publisher = self.driver.publisher
        await send_json(send, 200, publisher.sources() if publisher is not None else {})

    async def _kv_cache_blocks(self, body: bytes, receive: Receive, send: Send) -> None:
        engine = self.engine
        snapshot = cache_snapshot(engine.pool.stores, engine.events, self.driver.publisher)
        await send_json(send, 200, {"replica": self.name, **snapshot})

    # -- faults ----------------------------------------------------------------
    async def _get_fault(self, body: bytes, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self._fault_state())

    async def _post_fault(self, body: bytes, receive: Receive, send: Send) -> None:
        try:
            mode, factor = _parse_fault(body)
        except api.APIError as exc:
            await send_json(send, exc.status, exc.body)
            return
        self.set_fault(mode, factor)
        await send_json(send, 200, self._fault_state())

    def _fault_state(self) -> dict[str, Any]:
        factor = self.status_lag_s if self.fault == "busy" else self.slow_factor
        return {"replica": self.name, "mode": self.fault, "factor": factor}

    def set_fault(self, mode: str, factor: float = 4.0) -> None:
        """Enter fault ``mode``; each mode replaces the previous one.  ``factor`` is the
        engine's slowdown under ``slow`` and the seconds the status pages
        (``STATUS_ROUTES``) answer late under ``busy``: vLLM's API server answers them
        from the loop that serves its streams, and under load they come late while
        generation goes on (``core.busy``)."""
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; expected one of {FAULT_MODES}")
        self.fault = mode
        self.slow_factor = factor if mode == "slow" else 1.0
        self.status_lag_s = factor if mode == "busy" else 0.0
        self.engine.slowdown = self.slow_factor
        self.driver.set_paused(mode == "hang")
        if mode == "hang":
            self._unhung.clear()
        else:
            self._unhung.set()
        if mode == "die":
            logger.warning("replica %s: fault 'die', going away", self.name)
            # Let the drill's own response leave before the sockets are torn down.
            asyncio.get_running_loop().call_later(0.05, self._die)

    def _die(self) -> None:
        self.driver.abort_all()
        self.on_die()

    # -- generation ------------------------------------------------------------
    async def _chat(self, body: bytes, receive: Receive, send: Send) -> None:
        await self._generate("chat", body, receive, send)

    async def _completion(self, body: bytes, receive: Receive, send: Send) -> None:
        await self._generate("completion", body, receive, send)

    async def _generate(self, kind: api.Kind, body: bytes, receive: Receive, send: Send) -> None:
        try:
            request, request_id, queue = self._submit(kind, body)
        except api.APIError as exc:
            await send_json(send, exc.status, exc.body)
            return
        respond = self._stream if request.stream else self._complete
        try:
            await until_disconnect(receive, respond(request, request_id, queue, send))
        finally:
            self.driver.abort(request_id)  # frees the blocks unless it already finished

    def _submit(
        self, kind: api.Kind, body: bytes
    ) -> tuple[api.GenerationRequest, str, asyncio.Queue[RequestOutput]]:
        """Parse and queue a generation; APIError for anything the client got wrong."""
        request = api.parse_generation(
            kind, body, model=self.model, tokenizer=self.tokenizer, vocab=self.engine.vocab,
            max_model_len=self.engine.max_model_len, loras=self.loras, server=self.server,
            encoder=self.encoder,
        )  # fmt: skip
        request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        forced = list(request.forced.token_ids) if request.forced else None
        engine_request = EngineRequest(
            request_id, request.prompt_token_ids, request.max_tokens,
            ignore_eos=request.ignore_eos, seed=request.seed,
            lora_name=request.lora_name, lora_id=request.lora_id, output_token_ids=forced,
            priority=request.priority,
        )  # fmt: skip
        try:
            return request, request_id, self.driver.submit(engine_request)
        except ValueError as exc:  # the engine's own limits (context length)
            raise api.APIError(str(exc)) from None

    async def _stream(
        self,
        request: api.GenerationRequest,
        request_id: str,
        queue: asyncio.Queue[RequestOutput],
        send: Send,
    ) -> None:
        answer = Answer(request, request_id, int(time.time()), self.engine.vocab)
        await send(start(200, "text/event-stream; charset=utf-8"))
        last = None
        while last is None or last.finish_reason is None:
            outputs = await drain(queue)
            if last is None and request.kind == "chat":
                # vLLM sends the role chunk on the first engine output, i.e. after
                # prefill: the first body byte marks the first token, as TTFT needs.
                await send_sse(send, answer.opening())
            last = outputs[-1]
            finish = last.finish_reason.value if last.finish_reason else None
            tokens = [token for output in outputs for token in output.new_token_ids]
            await send_sse(send, answer.chunk(tokens, finish))
        if request.include_usage:
            counted = usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
            await send_sse(send, answer.usage_chunk(counted))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def _complete(
        self,
        request: api.GenerationRequest,
        request_id: str,
        queue: asyncio.Queue[RequestOutput],
        send: Send,
    ) -> None:
        tokens: list[int] = []
        while True:
            output = await queue.get()
            tokens += output.new_token_ids
            if output.finish_reason is not None:
                break
        counted = usage(output.prompt_tokens, output.completion_tokens, output.cached_tokens)
        answer = Answer(request, request_id, int(time.time()), self.engine.vocab)
        await send_json(send, 200, answer.full(tokens, output.finish_reason.value, counted))


# -- helpers ---------------------------------------------------------------------
def _parse_fault(body: bytes) -> tuple[str, float]:
    try:
        payload = json.loads(body or b"{}")
    except json.JSONDecodeError:
        raise api.APIError("The fault body must be JSON.") from None
    mode = payload.get("mode") if isinstance(payload, dict) else None
    if mode not in FAULT_MODES:
        raise api.APIError(f"`mode` must be one of {', '.join(FAULT_MODES)}.", param="mode")
    factor = payload.get("factor", 4.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0:
        raise api.APIError("`factor` must be a positive number.", param="factor")
    return mode, float(factor)
