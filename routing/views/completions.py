"""The OpenAI proxy: every inference route (``core.openai_request.Endpoint``).

``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/responses``, ``/v1/score`` and ``/v1/rerank`` all take this one path:
the view admits the request (API key, body size, JSON shape, known model),
describes it once for the policies, and hands it to the dispatcher.  All of it
reads memory only: the key hashes and models come from the runtime's topology
snapshot.  Every refusal is an OpenAI-style error, counted in ``/metrics``.

CSRF is exempt: these are API endpoints authenticated by bearer keys, never by
the console's session cookie.

The work is ``handle``: plain values in (``ApiRequest``), a ``ProxyResponse`` out, so
the plain ASGI path (``routing.api_plain``) serves it without Django's request and
response objects; ``proxy``, the Django view, wraps it for Django's URLconf.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from core import errors
from core.chat_template import TemplateError
from core.errors import ApiError
from core.key_limits import (
    NO_LIMITS,
    KeyLimits,
    model_not_allowed,
    refusal,
    reservation,
)
from core.lora import UnknownModelError, resolve_model
from core.openai_request import (
    CompletionRequest,
    Endpoint,
    describe,
    parse_request,
    session_key,
)
from core.prompts import PromptEncoder, prompt_tokens
from fleet.models import hash_api_key
from routing.calls import (
    ROUTE_FORWARDED_IN,
    ROUTE_LOCAL,
    ApiRequest,
    Headers,
    ProxyCall,
    ProxyResponse,
)
from routing.errors import error_description, to_django
from routing.internal_auth import forwarded_with
from routing.process import current_runtime, get_runtime

if TYPE_CHECKING:
    from core.block_identity import BlockScheme
    from core.types import RequestDescriptor
    from routing.runtime import BalancerRuntime

P = ParamSpec("P")
R = TypeVar("R")

# Label for refusals whose model is not a configured one: client-chosen strings
# must not become metric label values (unbounded cardinality).
UNKNOWN_MODEL_LABEL = "-"


@csrf_exempt
async def proxy(request: HttpRequest, endpoint: Endpoint) -> HttpResponseBase:
    """The view of every ``Endpoint``; the URLconf passes which one."""
    return to_django(await handle(api_request(request), endpoint))


def api_request(request: HttpRequest) -> ApiRequest:
    """A Django request as the views' plain values."""
    try:
        body: bytes | None = request.body
    except (RequestDataTooBig, ValueError):
        # Past DATA_UPLOAD_MAX_MEMORY_SIZE (above the API's limit), or a Content-Length
        # that is not a number: ``read_body`` answers 413 or 400 from the header.
        body = None
    return ApiRequest(
        request.method or "?",
        request.path,
        Headers(request.headers),
        request.META.get("REMOTE_ADDR"),
        body,
    )


async def handle(request: ApiRequest, endpoint: Endpoint) -> ProxyResponse:
    """Admit and dispatch one request to ``endpoint``; every refusal is an OpenAI-style
    error, counted in ``meridian_requests_total``."""
    arrived = time.monotonic()
    request_id = _request_id(request)
    model = UNKNOWN_MODEL_LABEL
    try:
        if request.method != "POST":
            raise errors.method_not_allowed(request.method, "POST")
        runtime = await get_runtime()
        call = await admit(request, runtime, endpoint, arrived=arrived, request_id=request_id)
        model = call.request.model
        return await serve(runtime, call)
    except ApiError as error:
        count_refusal(request, error, model)
        return error_description(error, request_id=request_id)


async def serve(runtime: BalancerRuntime, call: ProxyCall) -> ProxyResponse:
    """Dispatch an admitted call; when no response comes of it (refused, client gone, a
    bug) its key's hold is finished here (a response finishes it in the dispatcher's
    settle: when built, or when its stream ends however it ends)."""
    try:
        return await runtime.dispatcher.dispatch(call)
    except BaseException:
        call.finish(None)
        raise


def authorize(request: ApiRequest, runtime: BalancerRuntime) -> str:
    """The ``Authorization`` header of a request with a live API key; else 401, or 429
    while its address is held down after too many failed attempts
    (``core.auth_failures``).  A forward from an authenticated peer is never
    held down: the peer's address speaks for many clients, and it checked the key."""
    forwarded = forwarded_with(request.headers, runtime.config.internal_token)
    return _authorized(request, runtime, forwarded=forwarded)[0]


def _authorized(
    request: ApiRequest, runtime: BalancerRuntime, *, forwarded: bool
) -> tuple[str, str]:
    """``authorize`` with the hop check already made: the header and its key's hash."""
    limiter = runtime.auth_failures
    source = "" if forwarded else _source(request)
    now = time.monotonic()
    if source and (wait := limiter.retry_after(source, now)) is not None:
        raise errors.too_many_auth_failures(wait)
    try:
        return _checked_key(request, runtime)
    except ApiError:
        if source:
            limiter.record_failure(source, now)
        raise


def _source(request: ApiRequest) -> str:
    # The connecting address only: a header such as X-Forwarded-For is the client's to forge.
    return request.remote_addr or "-"


def _checked_key(request: ApiRequest, runtime: BalancerRuntime) -> tuple[str, str]:
    """The ``Authorization`` header and the SHA-256 of its key (hashed once per request)."""
    header = request.headers.get("Authorization", "")
    scheme, _, key = header.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise errors.invalid_api_key(provided=False)
    snapshot = runtime.snapshot
    key_hash = hash_api_key(key)
    if snapshot is None or key_hash not in snapshot.api_key_hashes:
        raise errors.invalid_api_key(provided=True)
    return header, key_hash


def read_body(request: ApiRequest, limit: int) -> bytes:
    """The body, refusing oversize ones by Content-Length before touching it.

    The declared length is checked first so a huge upload is refused without
    being parsed; the real length is checked too, for chunked bodies that
    declare none.  (Django's ASGI handler has already spooled the body by the time
    a view runs; ``DATA_UPLOAD_MAX_MEMORY_SIZE`` sits just above this limit.)
    """
    declared = request.headers.get("Content-Length", "")
    try:
        size = int(declared) if declared else None
    except ValueError:
        raise errors.ApiError(
            400, "Content-Length is not a number.", code="invalid_header"
        ) from None
    if size is not None and size > limit:
        raise errors.request_too_large(size, limit)
    body = request.body
    if body is None:
        raise errors.request_too_large(size, limit)
    if len(body) > limit:
        raise errors.request_too_large(len(body), limit)
    return body


async def admit(
    request: ApiRequest,
    runtime: BalancerRuntime,
    endpoint: Endpoint,
    *,
    arrived: float,
    request_id: str,
) -> ProxyCall:
    # The hop check and the key's hash are made once here and passed on.
    forwarded = forwarded_with(request.headers, runtime.config.internal_token)
    authorization, key_hash = _authorized(request, runtime, forwarded=forwarded)
    body = read_body(request, runtime.config.max_body_bytes)
    # A large body is parsed, checked and its blocks hashed in a worker thread: for a
    # body of megabytes each takes tens of milliseconds, which inline would stall every
    # other request on this event loop.  The Python parts there yield the GIL every few
    # milliseconds; json.loads itself (C) holds it for its whole run, about 10 ms per MB
    # of text and more for long arrays of token ids.
    large = len(body) > runtime.encoders.thread_chars
    parsed = await _maybe_in_thread(large, parse_request, body, endpoint)
    snapshot = runtime.snapshot
    try:
        # An adapter name routes among its base model's replicas (core.lora).
        model, adapter = resolve_model(
            parsed.model, snapshot.models if snapshot else (), runtime.adapters.adapters()
        )
    except UnknownModelError:
        raise errors.model_not_found(parsed.model) from None
    limits = snapshot.key_limits.get(key_hash, NO_LIMITS) if snapshot else NO_LIMITS
    if not limits.allows(parsed.model, model):
        if snapshot is not None:
            label = snapshot.key_labels.get(key_hash, "-")
            runtime.metrics.key_limited.inc(label, "model")
        raise model_not_allowed(parsed.model)
    encoder = runtime.encoders.for_model(model)
    try:
        # Tokens and blocks in one step: a large prompt crosses to a worker thread once
        # (a crossing costs ~40 µs of CPU).
        tokens, descriptor = await _maybe_in_thread(
            large or runtime.encoders.offloads(parsed.prompt),
            _tokens_and_descriptor,
            parsed,
            encoder,
            request_id=request_id,
            session_key=session_key(
                parsed, request.headers.get("X-Session-ID"), request.remote_addr
            ),
            # The base model's scheme: its replicas report the block size.
            scheme=runtime.block_schemes.scheme(model),
            forwarded=forwarded,
            model=model,
            lora=adapter,
        )
    except TemplateError as exc:
        # The engine would refuse the conversation the same way (vLLM answers 400).
        raise errors.invalid_value("messages", f"The chat template refused it: {exc}") from None
    call = ProxyCall(parsed, descriptor, body, authorization, request_id, arrived)
    if not descriptor.forwarded:
        # Counted once, where the request entered: a peer's forward was admitted there.
        await hold_key(runtime, call, key_hash, limits, len(tokens))
    return call


def _tokens_and_descriptor(
    parsed: CompletionRequest,
    encoder: PromptEncoder,
    *,
    request_id: str,
    session_key: str,
    scheme: BlockScheme,
    forwarded: bool,
    model: str,
    lora: str | None,
) -> tuple[Sequence[int], RequestDescriptor]:
    """The prompt's tokens (``TemplateError`` if its chat template refuses it) and the
    request described for the policies."""
    tokens = prompt_tokens(parsed.prompt, encoder)
    descriptor = describe(
        parsed,
        tokens,
        request_id=request_id,
        session_key=session_key,
        scheme=scheme,
        forwarded=forwarded,
        model=model,
        lora=lora,
    )
    return tokens, descriptor


async def hold_key(
    runtime: BalancerRuntime, call: ProxyCall, key_hash: str, limits: KeyLimits, prompt: int
) -> None:
    """Admit the call under its key's limits (``routing.key_limits``) or raise the 429."""
    snapshot = runtime.snapshot
    label = snapshot.key_labels.get(key_hash, "-") if snapshot else "-"
    reserve = reservation(prompt, call.request.max_tokens)
    grant = await runtime.key_limiter.admit(key_hash, label, limits, reserve, call.request_id)
    if grant.admission is not None and not grant.admission.admitted:
        runtime.metrics.key_limited.inc(label, grant.admission.verdict.name.lower())
        raise refusal(grant.admission)
    call.on_finish = grant.finish
    call.rate_limit_headers = grant.headers


async def _maybe_in_thread(
    offload: bool, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs
) -> R:
    if offload:
        return await asyncio.to_thread(function, *args, **kwargs)
    return function(*args, **kwargs)


def _request_id(request: ApiRequest) -> str:
    """The client's X-Request-ID when it is a sane header value, else a fresh one
    (it is sent on to replicas and peers, so it must stay short printable ASCII)."""
    given = request.headers.get("X-Request-ID", "")
    if 0 < len(given) <= 128 and given.isascii() and given.isprintable():
        return given
    return uuid4_hex()


def uuid4_hex() -> str:
    """What ``uuid.uuid4().hex`` returns (16 random bytes, the version 4 and RFC 4122
    variant bits set), without building a ``UUID``: 1.9 instead of 5.4 µs."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()


def count_refusal(request: ApiRequest, error: ApiError, model: str = UNKNOWN_MODEL_LABEL) -> None:
    """Count a refused ``/v1`` request in ``meridian_requests_total`` (``model``: a
    configured model's name, else ``-``)."""
    runtime = current_runtime()
    if runtime is None:
        return
    runtime.metrics.requests.inc(model, str(error.status), request_route(request, runtime))


def request_route(request: ApiRequest, runtime: BalancerRuntime) -> str:
    """The ``route`` label of a request this balancer answers."""
    forwarded = forwarded_with(request.headers, runtime.config.internal_token)
    return ROUTE_FORWARDED_IN if forwarded else ROUTE_LOCAL
