"""Send one validated request somewhere: the I/O around the dispatch core.

Where a request goes, when it waits and when it is refused is decided by
``core.dispatch.DispatchCore`` (SkyLB's Algorithm 1 behind the regional
FCFS queue, retries on another target, deadlines); this module carries those
decisions out on the balancer's event loop: it builds the replica's or the
peer's request (hop header ``X-Meridian-Forwarded-From`` on a forward: never a
second hop), opens it through the ``routing.transport.Transport``, waits in
``routing.queue_pump`` when the core says wait, reports a failure before the
first byte back to the core for the next decision, and relays, settles and
stamps the response, with the metrics.

Every placement holds a lease taken when the core placed it: given back by the
core when the attempt failed (``failed``) or ended (``finished``: when a
buffered response is built, or by the ``RelayStream``'s finish hook when a
streamed one ends in any way) or when the client left in the instant between
placement and resumption (``cancel``), and released in ``_attempt``'s
``finally`` on any other exit before a response existed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from core import errors
from core.dispatch import Decision, DispatchCore, Failure, Refuse, Send, Ticket, Wait
from core.remote import Placement
from core.sse import SseRelay, Usage
from routing.cache_view import CacheViewMonitor, Expectation
from routing.calls import HOP_HEADER, ROUTE_FORWARDED_OUT, ProxyCall, ProxyResponse
from routing.internal_auth import PEER_TOKEN_HEADER
from routing.queue_pump import QueuePump, Waiter
from routing.telemetry import CLIENT_CLOSED, BalancerMetrics
from routing.transport import Transport, UpstreamRequest
from routing.upstream import (
    OUTCOME_CLIENT_CLOSED,
    OUTCOME_OK,
    Opened,
    RelayStream,
    UpstreamFailure,
    join_url,
)

logger = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        core: DispatchCore[Waiter],
        pump: QueuePump,
        transport: Transport,
        metrics: BalancerMetrics,
        *,
        balancer: str,
        loop: asyncio.AbstractEventLoop,
        cache_view: CacheViewMonitor | None = None,
        internal_token: str = "",
    ) -> None:
        self.cache_view = cache_view
        self.internal_token = internal_token
        self.core = core
        self.pump = pump
        self.transport = transport
        self.metrics = metrics
        self.balancer = balancer
        self.loop = loop

    async def dispatch(self, call: ProxyCall) -> ProxyResponse:
        ticket: Ticket[Waiter] = Ticket(call.descriptor, Waiter())
        decision = self.core.arrive(ticket, self.loop.time())
        while True:
            if isinstance(decision, Wait):
                decision = await self.pump.wait(ticket)
            if isinstance(decision, Refuse):
                if decision.error.code == errors.QUEUE_FULL:
                    self.metrics.queue_rejected.inc(call.request.model)
                raise decision.error
            if decision.retry:
                self.metrics.retries.inc(call.request.model)
            outcome = await self._attempt(call, decision)
            if isinstance(outcome, ProxyResponse):
                return outcome
            decision = outcome

    # -- one attempt --------------------------------------------------------------------

    async def _attempt(
        self, call: ProxyCall, send: Send[Waiter]
    ) -> ProxyResponse | Decision[Waiter]:
        """The response, or the core's next decision after a failure before the first byte."""
        ticket, placement = send.ticket, send.placement
        route = ROUTE_FORWARDED_OUT if placement.peer else call.route_in
        handed_over = False
        expected = self._expected_cached(call, placement)
        try:
            if send.delay_s > 0:
                # A retry's jittered backoff, inside the try: a client that leaves
                # meanwhile still gives the lease back in the finally below.
                await asyncio.sleep(send.delay_s)
            opened = await self.transport.open(self._request(call, placement))
            if call.request.stream and 200 <= opened.status < 300:
                response = self._streaming(call, ticket, placement, route, opened, expected)
                handed_over = True  # the RelayStream's finish hook settles the lease
                return response
            payload = await opened.read_rest()
            return self._buffered(call, ticket, placement, route, opened, payload, expected)
        except UpstreamFailure as exc:
            self._count_failure(placement, exc.failure)
            return self.core.failed(ticket, exc.failure, self.loop.time())
        finally:
            if not handed_over:
                # Cancellation or an exception before a response existed; after the core
                # settled this lease (failed, finished) these are no-ops.
                placement.lease.release(ok=False)
                if placement.peer is None:
                    self.core.forecast.abandon(placement.label, call.descriptor.request_id)

    def _expected_cached(self, call: ProxyCall, placement: Placement) -> Expectation | None:
        """What the cache map expects the replica to find cached, taken before it runs."""
        if self.cache_view is None or placement.peer is not None:
            return None
        return self.cache_view.expect(placement.target.target_id, call.descriptor)

    def _request(self, call: ProxyCall, placement: Placement) -> UpstreamRequest:
        if placement.peer is None:
            headers = {
                "Content-Type": "application/json",
                "X-Request-ID": call.request_id,
                # Bytes are relayed raw (no decoding on the hot path), so ask for them plain.
                "Accept-Encoding": "identity",
            }
            url = join_url(placement.target.url, call.request.endpoint.path)
            # Engines that schedule by priority get the cost model's (Choice.priority).
            body = call.request.upstream_body(placement.priority)
            return UpstreamRequest(url, body, headers)
        # The peer redoes validation and auth on the client's body; a stream asks for
        # usage (stripped again here when the client did not) so the key's usage and
        # tokens are settled here, where the request was admitted.
        headers = {
            "Content-Type": "application/json",
            "Authorization": call.authorization,
            "X-Request-ID": call.request_id,
            "Accept-Encoding": "identity",
            HOP_HEADER: self.balancer,
            # Proves the hop header ours: the peer believes it only with this token.
            PEER_TOKEN_HEADER: self.internal_token,
        }
        session = call.descriptor.session_key
        if not call.request.user and session.isascii():
            # The peer would see our address as the client's: pass the session on
            # (a body's ``user`` travels in the body and wins there anyway).
            headers["X-Session-ID"] = session
        peer = placement.peer.spec
        url = join_url(peer.url, call.request.endpoint.path)
        return UpstreamRequest(url, call.request.upstream_body(), headers, peer=peer)

    def _streaming(
        self,
        call: ProxyCall,
        ticket: Ticket[Waiter],
        target: Placement,
        route: str,
        opened: Opened,
        expected: Expectation | None,
    ) -> ProxyResponse:
        ttft = opened.first_byte_at - call.arrived
        self.metrics.ttft.observe(ttft, call.request.model, route)
        self.core.first_token(ticket, opened.first_byte_at)
        sse = SseRelay(strip_usage=not call.request.client_wants_usage)

        def finished(outcome: str, relay: SseRelay | None) -> None:
            status = opened.status if outcome == OUTCOME_OK else CLIENT_CLOSED
            failure = None
            if outcome not in (OUTCOME_OK, OUTCOME_CLIENT_CLOSED):
                status, failure = 502, Failure("failed mid-stream")
                self._count_failure(target, failure)
            usage = relay.usage if relay else None
            ok = outcome == OUTCOME_OK
            # First token to last: how fast this replica decodes (the forecast's clock).
            decode_s = time.monotonic() - opened.first_byte_at
            self._settle(
                call, ticket, target, route, status, usage, ok=ok, failure=failure,
                expected=expected, decode_s=decode_s,
            )  # fmt: skip

        stream = RelayStream(opened, sse=sse, on_finish=finished)
        response = ProxyResponse(opened.status, opened.content_type, stream=stream)
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx in front must not buffer SSE either
        self._stamp(response, call, target, opened)
        return response

    def _buffered(
        self,
        call: ProxyCall,
        ticket: Ticket[Waiter],
        target: Placement,
        route: str,
        opened: Opened,
        payload: bytes,
        expected: Expectation | None,
    ) -> ProxyResponse:
        usage = None
        content_type = opened.content_type
        if 200 <= opened.status < 300:
            usage = _usage_of(payload)
        elif target.peer is None and opened.status >= 400:
            request = call.request
            shaped = errors.upstream_error_body(
                opened.status, payload, path=request.endpoint.path, model=request.model
            )
            if shaped is not None:  # vLLM's own errors are OpenAI-shaped already
                payload, content_type = shaped, "application/json"
        ok = opened.status < 400
        self._settle(call, ticket, target, route, opened.status, usage, ok=ok, expected=expected)
        response = ProxyResponse(opened.status, content_type, payload)
        self._stamp(response, call, target, opened)
        return response

    def _settle(
        self,
        call: ProxyCall,
        ticket: Ticket[Waiter],
        target: Placement,
        route: str,
        status: int,
        usage: Usage | None,
        *,
        ok: bool,
        failure: Failure | None = None,
        expected: Expectation | None = None,
        decode_s: float | None = None,
    ) -> None:
        """End-of-request accounting: lease, counters, latency, token usage, the
        cached tokens the engine reported against those the cache map expected, and
        the completion tokens against the length predicted."""
        outcome = self.core.finished(
            ticket,
            ok=ok,
            failure=failure,
            # A peer's replica is the peer's to learn from.
            output_tokens=usage.completion_tokens if usage and target.peer is None else None,
            now=self.loop.time(),
            decode_seconds=decode_s,
        )
        if outcome is not None and outcome.actual is not None:
            self.metrics.count_prediction(target.label, outcome.predicted, outcome.actual)
        call.finish(usage)
        metrics, model = self.metrics, call.request.model
        metrics.requests.inc(model, str(status), route)
        metrics.latency.observe(time.monotonic() - call.arrived, model, route)
        if usage is not None and target.peer is None:
            name = target.target.target_id
            self.core.local.record_usage(
                name, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens
            )
            metrics.prompt_tokens.inc(name, amount=usage.prompt_tokens)
            metrics.cached_tokens.inc(name, amount=usage.cached_tokens)
            metrics.completion_tokens.inc(name, amount=usage.completion_tokens)
            if ok and self.cache_view is not None:
                self.cache_view.observe(name, model, expected, usage.cached_tokens)

    def _stamp(
        self, response: ProxyResponse, call: ProxyCall, target: Placement, opened: Opened
    ) -> None:
        response["X-Request-ID"] = call.request_id
        for name, value in call.rate_limit_headers.items():
            response[name] = value
        if target.peer is None:
            response["X-Meridian-Balancer"] = self.balancer
            response["X-Meridian-Replica"] = target.target.target_id
            return
        for name in ("X-Meridian-Balancer", "X-Meridian-Replica"):
            if name in opened.response.headers:
                response[name] = opened.response.headers[name]
        response["X-Meridian-Entry"] = self.balancer

    def _count_failure(self, target: Placement, failure: Failure) -> None:
        reason = "capacity" if failure.capacity else ("http" if failure.status else "network")
        self.metrics.upstream_errors.inc(target.label, reason)
        logger.warning("attempt on %s failed: %s", target.label, failure.reason)


def _usage_of(payload: bytes) -> Usage | None:
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    return Usage.from_body(body)
