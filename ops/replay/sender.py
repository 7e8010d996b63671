"""Sending workload requests with the official ``openai`` client.

Every request streams with ``stream_options.include_usage`` so one code path
measures time to first token (the first chunk that carries text) and reads the
prompt, completion and cached token counts from the final usage chunk, exactly as
any OpenAI SDK user would see them.  The reply text is collected because the next
turn of a conversation must quote it.

Errors the server or network can cause (HTTP 4xx/5xx, refused connections,
timeouts, error events in the stream) become failed ``Outcome``s with their
message; the replay counts them and goes on.  Anything else is a bug and
propagates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import openai
from openai.types.chat import ChatCompletionMessageParam

from ops.replay.stats import Outcome
from sim.workloads import ApiKind, Request


class Sender(Protocol):
    """Sends one request and reports how it ended; never raises for server errors."""

    async def send(self, request: Request) -> Outcome: ...


class ReplayError(Exception):
    """A replay that cannot start or must stop, with a message for the user."""


class ApiKeyRejected(ReplayError):
    """The endpoint answered 401 before anything succeeded: the key is wrong."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(
            f"{where} rejected the API key (HTTP 401: {detail}); "
            "pass a valid key with --api-key or set MERIDIAN_API_KEY"
        )


def api_base(url: str) -> str:
    """The SDK's ``base_url`` for a server root (``http://host:port``) or a ``/v1`` URL."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def make_client(base_url: str, api_key: str, *, timeout: float = 300.0) -> openai.AsyncOpenAI:
    # No SDK retries: a replay reports what the gateway did, and the gateway
    # retries on its own; a hidden client retry would blur error counts and TTFT.
    return openai.AsyncOpenAI(
        base_url=api_base(base_url),
        # The SDK refuses an empty key; a replica without auth ignores this one.
        api_key=api_key or "no-key",
        max_retries=0,
        timeout=timeout,
    )


async def first_model(client: openai.AsyncOpenAI) -> str:
    """The first model ``GET /v1/models`` lists, with a clear error when there is none."""
    try:
        page = await client.models.list()
    except openai.AuthenticationError as exc:
        raise ApiKeyRejected(str(client.base_url), describe(exc)) from exc
    except openai.APIError as exc:
        raise ReplayError(f"cannot list models at {client.base_url}: {describe(exc)}") from exc
    if not page.data:
        raise ReplayError(f"{client.base_url} lists no models; pass --model")
    return page.data[0].id


def describe(exc: openai.APIError) -> str:
    """The server's own error message when it sent an OpenAI error object, else the
    SDK's message, with the underlying cause for connection errors."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    cause = exc.__cause__
    if isinstance(exc, openai.APIConnectionError) and cause is not None:
        return f"{exc.message} ({type(cause).__name__}: {cause})"
    return exc.message


def error_kind(exc: openai.APIError) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    return "stream error"


class OpenAISender:
    """Streams requests to one OpenAI-compatible endpoint for one model."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.model = model
        self.clock = clock

    async def send(self, request: Request) -> Outcome:
        started = self.clock()
        try:
            return await self._stream(request, started)
        except openai.APIError as exc:
            status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
            return Outcome(
                ok=False,
                latency=self.clock() - started,
                status=status,
                error_kind=error_kind(exc),
                error=describe(exc),
            )

    async def _stream(self, request: Request, started: float) -> Outcome:
        ttft: float | None = None
        parts: list[str] = []
        usage: Any = None
        async with await self._create(request) as stream:
            async for chunk in stream:
                text = _chunk_text(chunk)
                if text:
                    if ttft is None:
                        ttft = self.clock() - started
                    parts.append(text)
                if chunk.usage is not None:
                    usage = chunk.usage
        details = getattr(usage, "prompt_tokens_details", None)
        return Outcome(
            ok=True,
            latency=self.clock() - started,
            reply="".join(parts),
            ttft=ttft,
            prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
            completion_tokens=getattr(usage, "completion_tokens", 0) or 0,
            cached_tokens=getattr(details, "cached_tokens", 0) or 0,
        )

    async def _create(self, request: Request) -> Any:
        common: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.session_key:
            # Meridian's balancer keys sticky sessions on OpenAI's ``user`` field.
            common["user"] = request.session_key
        if request.ignore_eos:
            # vLLM's extension: generate exactly max_tokens, as the trace recorded.
            common["extra_body"] = {"ignore_eos": True}
        if request.kind is ApiKind.CHAT:
            # Our messages are plain role/content dicts, which is what these types describe.
            messages = cast("list[ChatCompletionMessageParam]", list(request.messages))
            return await self.client.chat.completions.create(messages=messages, **common)
        return await self.client.completions.create(prompt=request.prompt, **common)


def _chunk_text(chunk: Any) -> str:
    """Text carried by a chat or completion chunk (the usage chunk has no choices)."""
    if not chunk.choices:
        return ""
    choice = chunk.choices[0]
    delta = getattr(choice, "delta", None)
    if delta is not None:
        return delta.content or ""
    return getattr(choice, "text", None) or ""
