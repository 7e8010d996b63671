"""Send one validated request somewhere: SkyLB's two layers behind a regional queue.

A request asks ``routing.core.remote.place`` (Algorithm 1, HANDLEREQUEST, §3.1)
for a target: a local replica when one is *available* (SP-P/SP-O/blind,
§3.3), otherwise an available peer balancer chosen by the remote-layer policy,
unless the request was forwarded to us (hop header
``X-Meridian-Forwarded-From``: never a second hop).  When nothing is available
but something healthy exists, the request waits FCFS in the model's queue
(``routing.queue_pump``) until a probe, a completion or a peer report frees a target,
or its deadline passes (503), or the queue is full (429).

A failed attempt before the first byte excludes that target and tries again
(through the queue, at its front), up to ``MERIDIAN_MAX_ATTEMPTS`` attempts; a
replica that failed is marked unhealthy at once (the prober brings it back).

Every placement holds a lease taken when it was placed: released in this
module's ``finally`` when the attempt does not become the response, by
``_settle`` when a buffered response is built, by the ``RelayStream``'s finish
hook when a streamed one ends in any way, or by ``_wait`` when the client left
in the instant between placement and resumption.

Demo mode charges the configured inter-region RTT once each way on a forward:
half before the request is sent, half before the first byte is relayed back, so
TTFT grows by one RTT as it would across regions.  Production does not sleep
(the network already charges it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse

from routing.calls import HOP_HEADER, ROUTE_FORWARDED_OUT, ProxyCall
from routing.core import errors
from routing.core.leases import Lease
from routing.core.pending_queue import QueueFullError
from routing.core.remote import PeerLink, Placement, place, worth_waiting
from routing.core.sse import SseRelay, Usage
from routing.queue_pump import Waiter
from routing.telemetry import CLIENT_CLOSED, QUEUE_CANCELLED
from routing.upstream import (
    OUTCOME_CLIENT_CLOSED,
    OUTCOME_OK,
    Opened,
    RelayStream,
    UpstreamFailure,
    join_url,
    open_upstream,
)

if TYPE_CHECKING:
    from routing.runtime import BalancerRuntime

logger = logging.getLogger(__name__)


class Dispatcher:
    def __init__(self, runtime: BalancerRuntime) -> None:
        self.rt = runtime
        # The demo's emulated RTT wait; a seam so tests can observe it without waiting.
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def dispatch(self, call: ProxyCall) -> HttpResponseBase:
        tried: set[str] = set()
        tried_peers: set[str] = set()
        last: UpstreamFailure | None = None
        for attempt in range(self.rt.config.max_attempts):
            placement = await self._placement(
                call, frozenset(tried), frozenset(tried_peers), retry=attempt > 0
            )
            if placement is None:
                break
            if attempt:
                self.rt.metrics.retries.inc(call.request.model)
            (tried_peers if placement.peer else tried).add(placement.label)
            outcome = await self._attempt(call, placement)
            if isinstance(outcome, HttpResponseBase):
                return outcome
            last = outcome
        raise self._refusal(call, attempts=len(tried) + len(tried_peers), last=last)

    # -- placement: now, or after waiting in the queue ------------------------------------

    async def _placement(
        self, call: ProxyCall, tried: frozenset[str], tried_peers: frozenset[str], *, retry: bool
    ) -> Placement | None:
        queue = self.rt.queues.for_model(call.request.model)
        # FCFS: a newcomer may not overtake requests already waiting (a retry may).
        if retry or not queue:
            placed = place(
                call.descriptor,
                self.rt.router,
                self.rt.remote,
                tried=tried,
                tried_peers=tried_peers,
            )
            if placed is not None:
                return placed
        if not worth_waiting(call.descriptor, self.rt.router, self.rt.remote, tried):
            return None
        waiter = Waiter(asyncio.get_running_loop().create_future(), tried, tried_peers)
        now = self.rt.loop.time()
        try:
            entry = queue.push(call.descriptor, waiter, now, front=retry)
        except QueueFullError as full:
            self.rt.metrics.queue_rejected.inc(call.request.model)
            raise errors.queue_full(
                call.request.model, full.max_len, self.rt.config.retry_after_s
            ) from None
        self.rt.pump.queued()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            # The client left while queued, or in the instant after being placed.
            if queue.remove(entry):
                self.rt.metrics.queue_wait.observe(
                    entry.waited(self.rt.loop.time()), call.request.model, QUEUE_CANCELLED
                )
            elif _delivered(waiter.future):
                waiter.future.result().lease.release(ok=False)
            raise

    # -- one attempt --------------------------------------------------------------------

    async def _attempt(
        self, call: ProxyCall, placement: Placement
    ) -> HttpResponseBase | UpstreamFailure:
        route = ROUTE_FORWARDED_OUT if placement.peer else call.route_in
        lease = placement.lease
        handed_over = False
        try:
            if placement.peer is not None:
                if self.rt.partition.blocks(placement.peer.spec.name):
                    # drill_partition: the forward fails as a cut network would, before
                    # a byte is sent, so the request retries elsewhere.
                    raise UpstreamFailure(f"peer {placement.label} unreachable (partitioned)")
                await self._demo_half_rtt(placement.peer)
                url, body, headers = self._peer_request(call, placement.peer)
            else:
                url, body, headers = self._replica_request(call, placement)
            opened = await open_upstream(self.rt.upstream, url, body, headers)
            if placement.peer is not None:
                await self._demo_half_rtt(placement.peer)  # the first byte's way back
            if call.request.stream and 200 <= opened.status < 300:
                response = self._streaming(call, placement, route, opened, lease)
                handed_over = True  # the RelayStream releases the lease when it ends
                return response
            payload = await opened.read_rest()
            return self._buffered(call, placement, route, opened, payload, lease)
        except UpstreamFailure as failure:
            self._failed(placement, failure)
            return failure
        finally:
            if not handed_over:
                # Failure, cancellation or exception before a response existed; after
                # _buffered settled the lease this is a no-op (release is idempotent).
                lease.release(ok=False)

    async def _demo_half_rtt(self, peer: PeerLink) -> None:
        rtt = peer.spec.rtt_ms
        if self.rt.config.demo and math.isfinite(rtt) and rtt > 0:
            await self.sleep(rtt / 2000.0)

    def _replica_request(
        self, call: ProxyCall, placement: Placement
    ) -> tuple[str, bytes, dict[str, str]]:
        url = join_url(placement.target.url, call.request.endpoint.path)
        headers = {
            "Content-Type": "application/json",
            "X-Request-ID": call.request_id,
            # Bytes are relayed raw (no decoding on the hot path), so ask for them plain.
            "Accept-Encoding": "identity",
        }
        return url, call.request.upstream_body(), headers

    def _peer_request(self, call: ProxyCall, peer: PeerLink) -> tuple[str, bytes, dict[str, str]]:
        # The peer redoes validation, auth and accounting on the client's own body.
        headers = {
            "Content-Type": "application/json",
            "Authorization": call.authorization,
            "X-Request-ID": call.request_id,
            "Accept-Encoding": "identity",
            HOP_HEADER: self.rt.config.balancer,
        }
        session = call.descriptor.session_key
        if not call.request.user and session.isascii():
            # The peer would see our address as the client's: pass the session on
            # (a body's ``user`` travels in the body and wins there anyway).
            headers["X-Session-ID"] = session
        return join_url(peer.spec.url, call.request.endpoint.path), call.raw_body, headers

    def _streaming(
        self, call: ProxyCall, target: Placement, route: str, opened: Opened, lease: Lease
    ) -> StreamingHttpResponse:
        ttft = opened.first_byte_at - call.arrived
        self.rt.metrics.ttft.observe(ttft, call.request.model, route)
        sse = None if target.peer else SseRelay(strip_usage=not call.request.client_wants_usage)

        def finished(outcome: str, relay: SseRelay | None) -> None:
            status = opened.status if outcome == OUTCOME_OK else CLIENT_CLOSED
            if outcome not in (OUTCOME_OK, OUTCOME_CLIENT_CLOSED):
                status = 502
                self._failed(target, UpstreamFailure("failed mid-stream"))
            usage = relay.usage if relay else None
            self._settle(call, target, route, status, usage, lease, ok=outcome == OUTCOME_OK)

        stream = RelayStream(opened, sse=sse, on_finish=finished)
        response = StreamingHttpResponse(
            stream, status=opened.status, content_type=opened.content_type
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx in front must not buffer SSE either
        self._stamp(response, call, target, opened)
        return response

    def _buffered(
        self,
        call: ProxyCall,
        target: Placement,
        route: str,
        opened: Opened,
        payload: bytes,
        lease: Lease,
    ) -> HttpResponse:
        usage = None
        if target.peer is None and 200 <= opened.status < 300:
            usage = _usage_of(payload)
        self._settle(call, target, route, opened.status, usage, lease, ok=opened.status < 400)
        response = HttpResponse(payload, status=opened.status, content_type=opened.content_type)
        self._stamp(response, call, target, opened)
        return response

    def _settle(
        self,
        call: ProxyCall,
        target: Placement,
        route: str,
        status: int,
        usage: Usage | None,
        lease: Lease,
        *,
        ok: bool,
    ) -> None:
        """End-of-request accounting: lease, counters, latency, token usage."""
        lease.release(ok=ok)
        metrics, model = self.rt.metrics, call.request.model
        metrics.requests.inc(model, str(status), route)
        metrics.latency.observe(time.monotonic() - call.arrived, model, route)
        if usage is not None and target.peer is None:
            name = target.target.target_id
            self.rt.router.record_usage(
                name, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens
            )
            metrics.prompt_tokens.inc(name, amount=usage.prompt_tokens)
            metrics.cached_tokens.inc(name, amount=usage.cached_tokens)
            metrics.completion_tokens.inc(name, amount=usage.completion_tokens)

    def _stamp(
        self, response: HttpResponseBase, call: ProxyCall, target: Placement, opened: Opened
    ) -> None:
        response["X-Request-ID"] = call.request_id
        if target.peer is None:
            response["X-Meridian-Balancer"] = self.rt.config.balancer
            response["X-Meridian-Replica"] = target.target.target_id
            return
        for name in ("X-Meridian-Balancer", "X-Meridian-Replica"):
            if name in opened.response.headers:
                response[name] = opened.response.headers[name]
        response["X-Meridian-Entry"] = self.rt.config.balancer

    def _failed(self, target: Placement, failure: UpstreamFailure) -> None:
        reason = "capacity" if failure.capacity else ("http" if failure.status else "network")
        self.rt.metrics.upstream_errors.inc(target.label, reason)
        logger.warning("attempt on %s failed: %s", target.label, failure.reason)
        if target.peer is None and failure.marks_unhealthy:
            self.rt.router.mark_failed(target.target.target_id)

    def _refusal(
        self, call: ProxyCall, *, attempts: int, last: UpstreamFailure | None
    ) -> errors.ApiError:
        model, retry = call.request.model, self.rt.config.retry_after_s
        if last is not None and not last.capacity:
            return errors.upstream_failed(model, attempts, last.reason)
        healthy, _ = self.rt.router.counts(model)
        # A peer with healthy replicas counts only if this request may still be forwarded.
        peer_busy = not call.descriptor.forwarded and self.rt.remote.has_healthy(model)
        if healthy or (last is not None and last.capacity) or peer_busy:
            return errors.at_capacity(model, retry)
        return errors.no_healthy_replica(model, retry)


def _delivered(future: asyncio.Future[Placement]) -> bool:
    """The pump placed this request (``exception()`` also marks a 503 as seen)."""
    return future.done() and not future.cancelled() and future.exception() is None


def _usage_of(payload: bytes) -> Usage | None:
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    return Usage.from_openai(body.get("usage")) if isinstance(body, dict) else None
