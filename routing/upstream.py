"""One upstream call: open it, wait for its first byte, relay it without buffering.

``open_upstream`` POSTs the request through the relay's keep-alive pool
(``routing.upstream_pool``) and waits for the first body chunk before the proxy
commits a response to the client.  Until then nothing has reached the client,
so any failure (connect error, reset, 5xx, a replica that died after its
headers) is an ``UpstreamFailure`` the dispatcher retries on a *different*
target.

``RelayStream`` is the body of the ``StreamingHttpResponse``: an async iterator
over the rest of the upstream body, with the accounting in ``try/finally``.
Django's ASGI handler cancels the response task when the client disconnects
(``ASGIHandler.handle`` → ``task.cancel()``), which raises ``CancelledError`` at
our pending ``await`` on the upstream; the ``finally`` then closes the upstream
response, which closes the replica connection mid-body: vLLM (and the emulated
replica) see the disconnect and abort the request, freeing its KV blocks.  If
Django drops the response before ever iterating it (the client left between
the view returning and the first send), a ``weakref.finalize`` hook does the
same cleanup from the event loop, so no exit path leaks a lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from core.dispatch import Failure
from core.sse import SseRelay
from routing.asgi_types import BodyWriter
from routing.upstream_pool import UpstreamError, UpstreamPool, UpstreamResponse

logger = logging.getLogger(__name__)

# Bytes of an upstream error body kept for the log/diagnostic (never the stream).
_ERROR_BODY_LIMIT = 2048

OUTCOME_OK = "ok"
OUTCOME_CLIENT_CLOSED = "client_closed"
OUTCOME_UPSTREAM_ERROR = "upstream_error"


def join_url(base: str, path: str) -> str:
    """``base`` + ``path``, tolerating a base URL that already ends in ``/v1``."""
    base = base.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path


class UpstreamFailure(Exception):
    """A failed attempt before any byte reached the client; the request may go elsewhere.

    ``failure`` is what the dispatch core hears (``DispatchCore.failed``)."""

    def __init__(self, reason: str, *, status: int | None = None, capacity: bool = False) -> None:
        super().__init__(reason)
        # 429: the target is busy, not broken; try another without marking it unhealthy.
        self.failure = Failure(reason, status, capacity)

    @property
    def reason(self) -> str:
        return self.failure.reason

    @property
    def status(self) -> int | None:
        return self.failure.status

    @property
    def capacity(self) -> bool:
        return self.failure.capacity

    @property
    def marks_unhealthy(self) -> bool:
        return self.failure.marks_unhealthy


@dataclass(slots=True)
class Opened:
    """An upstream response whose first body chunk has arrived."""

    response: UpstreamResponse
    first_chunk: bytes
    chunks: AsyncIterator[bytes]
    first_byte_at: float

    @property
    def status(self) -> int:
        return self.response.status_code

    @property
    def content_type(self) -> str:
        return str(self.response.headers.get("content-type", "application/json"))

    async def read_rest(self) -> bytes:
        """The whole body (non-streaming requests); failures stay retryable."""
        parts = [self.first_chunk]
        try:
            async for chunk in self.chunks:
                parts.append(chunk)
        except UpstreamError as exc:
            raise UpstreamFailure(f"body read failed: {_describe(exc)}") from exc
        finally:
            await self.response.aclose()
        return b"".join(parts)


async def open_upstream(
    pool: UpstreamPool, url: str, body: bytes, headers: Mapping[str, str]
) -> Opened:
    """POST and wait for the first body byte; ``UpstreamFailure`` if there is none."""
    try:
        response = await pool.post(url, body, headers)
    except UpstreamError as exc:
        raise UpstreamFailure(_describe(exc)) from exc
    try:
        if response.status_code == 429 or response.status_code >= 500:
            detail = (await response.aread())[:_ERROR_BODY_LIMIT].decode(errors="replace")
            raise UpstreamFailure(
                f"HTTP {response.status_code}: {detail.strip()[:200]}",
                status=response.status_code,
                capacity=response.status_code == 429,
            )
        chunks = response.aiter_raw()
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            raise UpstreamFailure("empty response body") from None
        except UpstreamError as exc:
            raise UpstreamFailure(f"failed before the first byte: {_describe(exc)}") from exc
        return Opened(response, first, chunks, time.monotonic())
    except BaseException:
        # Also on cancellation (client left while we waited): close so the target sees it.
        await response.aclose()
        raise


FinishHook = Callable[[str, SseRelay | None], None]


class _Finisher:
    """Runs the end-of-stream accounting exactly once, whichever path gets there first."""

    def __init__(
        self,
        response: UpstreamResponse,
        on_finish: FinishHook,
        sse: SseRelay | None,
    ):
        self.response = response
        self.on_finish = on_finish
        self.sse = sse
        self.done = False
        self.loop = asyncio.get_running_loop()

    def settle(self, outcome: str) -> bool:
        if self.done:
            return False
        self.done = True
        self.on_finish(outcome, self.sse)
        return True

    async def finish(self, outcome: str) -> None:
        try:
            self.settle(outcome)
        finally:
            await self.response.aclose()

    def abandoned(self) -> None:
        """The body was dropped unread; called from any thread by ``weakref.finalize``."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._abandoned_in_loop)

    def _abandoned_in_loop(self) -> None:
        if self.settle(OUTCOME_CLIENT_CLOSED):
            self.loop.create_task(self.response.aclose())


class RelayStream:
    """The stream of a ``ProxyResponse`` relaying an opened upstream chunk by chunk.

    With an ``SseRelay`` the stream is parsed event by event (usage recorded and,
    for clients that did not ask, the usage-only chunk removed); without one the
    bytes pass through as they are.  A peer's stream is parsed too: the balancer asks
    the peer for its usage (the key's accounting happens where the request entered)
    and removes it here when the client did not ask.
    """

    def __init__(self, opened: Opened, *, sse: SseRelay | None, on_finish: FinishHook) -> None:
        self._opened = opened
        self._sse = sse
        self._finisher = _Finisher(opened.response, on_finish, sse)
        self._finalizer = weakref.finalize(self, self._finisher.abandoned)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._relay()

    async def _relay(self) -> AsyncIterator[bytes]:
        outcome = OUTCOME_CLIENT_CLOSED
        try:
            data = self._filter(self._opened.first_chunk)
            if data:
                yield data
            async for chunk in self._opened.chunks:
                data = self._filter(chunk)
                if data:
                    yield data
            if self._sse is not None and (tail := self._sse.flush()):
                yield tail
            outcome = OUTCOME_OK
        except UpstreamError as exc:
            # Committed already: the client cannot be answered with a status any more,
            # so end the stream with an OpenAI-style error event the SDKs raise on.
            outcome = OUTCOME_UPSTREAM_ERROR
            logger.warning("upstream failed mid-stream: %s", _describe(exc))
            yield _error_event(f"the upstream failed mid-stream: {_describe(exc)}")
        finally:
            self._finalizer.detach()
            await self._finisher.finish(outcome)

    async def relay_to(self, out: BodyWriter) -> None:
        """The stream written to ``out`` as ``__aiter__`` would yield it, but from the
        upstream connection's read callbacks: one write per upstream read, no future,
        task step or ASGI message per read, and the last read written with the end of
        the body.  Reading pauses while ``out``'s client cannot take more.  Settles as
        the iterator does, before the end is written; cancelled (the client left), it
        settles as closed by the client and writes nothing more."""
        outcome = OUTCOME_CLIENT_CLOSED
        opened = self._opened
        ended: asyncio.Future[tuple[BaseException | None, bytes]]
        ended = asyncio.get_running_loop().create_future()
        try:
            await _close_iterator(opened.chunks)  # the callbacks read on instead
            out.write(self._filter(opened.first_chunk))  # with the head, even if empty
            out.hold(opened.response.pause_reading, opened.response.resume_reading)
            opened.response.stream_to(_Sink(self._filter, out.write, ended))
            error, rest = await ended
            last = self._filter(rest) if rest else b""
            if isinstance(error, UpstreamError):
                outcome = OUTCOME_UPSTREAM_ERROR
                logger.warning("upstream failed mid-stream: %s", _describe(error))
                last += _error_event(f"the upstream failed mid-stream: {_describe(error)}")
            elif error is not None:
                raise error
            else:
                if self._sse is not None:
                    last += self._sse.flush()
                outcome = OUTCOME_OK
        finally:
            out.release()
            self._finalizer.detach()
            await self._finisher.finish(outcome)
        out.finish(last)

    def _filter(self, chunk: bytes) -> bytes:
        return self._sse.feed(chunk) if self._sse is not None else chunk

    async def aclose(self) -> None:
        """Settle a relay its client left before reading it to the end (closing the
        upstream); a no-op once the relay has ended and settled."""
        self._finalizer.detach()
        await self._finisher.finish(OUTCOME_CLIENT_CLOSED)


class _Sink:
    """The upstream connection's ``BodySink`` for ``RelayStream.relay_to``: each read
    filtered and written on; the end (or an error, the filter's own included: it must
    not escape into the parser's callback) resolves ``ended``."""

    __slots__ = ("_ended", "_filter", "_write")

    def __init__(
        self,
        filter_: Callable[[bytes], bytes],
        write: Callable[[bytes], None],
        ended: asyncio.Future[tuple[BaseException | None, bytes]],
    ) -> None:
        self._filter, self._write, self._ended = filter_, write, ended

    def body(self, data: bytes) -> None:
        if self._ended.done():
            return
        try:
            data = self._filter(data)
            if data:
                self._write(data)
        except Exception as exc:
            self._ended.set_result((exc, b""))

    def end(self, error: BaseException | None, rest: bytes) -> None:
        if not self._ended.done():
            self._ended.set_result((error, rest))


async def _close_iterator(chunks: AsyncIterator[bytes]) -> None:
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()


def _error_event(message: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
