"""Send one validated request somewhere: a local replica, else the nearest peer.

SkyLB's two layers (§3.2): the request goes to a local replica when one is
available (chosen by the model's policy); otherwise to the nearest *available*
peer balancer, with the hop header ``X-Meridian-Forwarded-From`` so the peer
serves it locally and never forwards it again.  A failed attempt before the
first byte excludes that target and tries the next, up to
``MERIDIAN_MAX_ATTEMPTS`` attempts in all; a replica that failed is marked
unhealthy at once (the prober brings it back), never retried for this request.

Every attempt holds a lease (``routing.core.leases``): released in this
module's ``finally`` when the attempt does not become the response, by
``_settle`` when a buffered response is built, or by the ``RelayStream``'s
finish hook when a streamed one ends in any way.

Demo mode sleeps one configured inter-region RTT before each forward, so the
console and the benchmarks see what a real cross-region hop costs; production
does not (the network already charges it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse

from routing.core import errors
from routing.core.leases import Lease
from routing.core.openai_request import CompletionRequest
from routing.core.peers import PeerCandidate, rank_peers
from routing.core.sse import SseRelay, Usage
from routing.core.types import RequestDescriptor, TargetState
from routing.telemetry import CLIENT_CLOSED
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

HOP_HEADER = "X-Meridian-Forwarded-From"
ROUTE_LOCAL = "local"
ROUTE_FORWARDED_OUT = "forwarded_out"
ROUTE_FORWARDED_IN = "forwarded_in"


@dataclass(slots=True)
class ProxyCall:
    """One client request on its way through the balancer."""

    request: CompletionRequest
    descriptor: RequestDescriptor
    raw_body: bytes
    authorization: str
    request_id: str
    arrived: float  # time.monotonic() when the view started

    @property
    def route_in(self) -> str:
        return ROUTE_FORWARDED_IN if self.descriptor.forwarded else ROUTE_LOCAL


@dataclass(frozen=True, slots=True)
class _Target:
    """Where one attempt goes: a replica (``peer`` None) or a peer balancer."""

    state: TargetState
    peer: PeerCandidate | None = None

    @property
    def label(self) -> str:
        return self.peer.spec.name if self.peer else self.state.target_id


class Dispatcher:
    def __init__(self, runtime: BalancerRuntime) -> None:
        self.rt = runtime
        # Lease targets for peers, so forwarded requests count in the in-flight total.
        self._peer_states: dict[str, TargetState] = {}
        # The demo's emulated RTT wait; a seam so tests can observe it without waiting.
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def dispatch(self, call: ProxyCall) -> HttpResponseBase:
        tried: set[str] = set()
        tried_peers: set[str] = set()
        last: UpstreamFailure | None = None
        for attempt in range(self.rt.config.max_attempts):
            target = self._next_target(call, tried, tried_peers)
            if target is None:
                break
            if attempt:
                self.rt.metrics.retries.inc(call.request.model)
            (tried_peers if target.peer else tried).add(target.label)
            outcome = await self._attempt(call, target)
            if isinstance(outcome, HttpResponseBase):
                return outcome
            last = outcome
        raise self._refusal(call, attempts=len(tried) + len(tried_peers), last=last)

    def _next_target(
        self, call: ProxyCall, tried: set[str], tried_peers: set[str]
    ) -> _Target | None:
        selection = self.rt.router.select(call.descriptor, frozenset(tried))
        if selection.target is not None:
            return _Target(selection.target)
        if call.descriptor.forwarded:
            return None  # one hop at most
        peers = self._available_peers(call.request.model, frozenset(tried_peers))
        if not peers:
            return None
        peer = peers[0]
        state = self._peer_states.setdefault(
            peer.spec.name, TargetState(target_id=f"peer:{peer.spec.name}", url=peer.spec.url)
        )
        state.url = peer.spec.url
        return _Target(state, peer)

    def _available_peers(self, model: str, exclude: frozenset[str]) -> list[PeerCandidate]:
        snapshot = self.rt.snapshot
        if snapshot is None:
            return []
        return rank_peers(
            snapshot.peers,
            self.rt.peers.heartbeats,
            model,
            now=time.time(),
            max_age_s=self.rt.config.heartbeat_ttl_s,
            queue_buffer=self.rt.config.peer_queue_buffer,
            exclude=exclude,
        )

    async def _attempt(
        self, call: ProxyCall, target: _Target
    ) -> HttpResponseBase | UpstreamFailure:
        route = ROUTE_FORWARDED_OUT if target.peer else call.route_in
        if target.peer is not None:
            lease = self.rt.router.ledger.acquire(target.state, call.request_id)
        else:
            lease = self.rt.router.lease(call.descriptor, target.state)
        handed_over = False
        try:
            if target.peer is not None:
                await self._demo_rtt(target.peer)
                url, body, headers = self._peer_request(call, target.peer)
            else:
                url, body, headers = self._replica_request(call, target.state)
            opened = await open_upstream(self.rt.client, url, body, headers)
            if call.request.stream and 200 <= opened.status < 300:
                response = self._streaming(call, target, route, opened, lease)
                handed_over = True  # the RelayStream releases the lease when it ends
                return response
            payload = await opened.read_rest()
            return self._buffered(call, target, route, opened, payload, lease)
        except UpstreamFailure as failure:
            self._failed(target, failure)
            return failure
        finally:
            if not handed_over:
                # Failure, cancellation or exception before a response existed; after
                # _buffered settled the lease this is a no-op (release is idempotent).
                lease.release(ok=False)

    async def _demo_rtt(self, peer: PeerCandidate) -> None:
        if self.rt.config.demo and math.isfinite(peer.spec.rtt_ms) and peer.spec.rtt_ms > 0:
            await self.sleep(peer.spec.rtt_ms / 1000.0)

    def _replica_request(
        self, call: ProxyCall, target: TargetState
    ) -> tuple[str, bytes, dict[str, str]]:
        url = join_url(target.url, call.request.endpoint.path)
        headers = {
            "Content-Type": "application/json",
            "X-Request-ID": call.request_id,
            # Bytes are relayed raw (no decoding on the hot path), so ask for them plain.
            "Accept-Encoding": "identity",
        }
        return url, call.request.upstream_body(), headers

    def _peer_request(
        self, call: ProxyCall, peer: PeerCandidate
    ) -> tuple[str, bytes, dict[str, str]]:
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
        self, call: ProxyCall, target: _Target, route: str, opened: Opened, lease: Lease
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
        target: _Target,
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
        target: _Target,
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
            name = target.state.target_id
            self.rt.router.record_usage(
                name, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens
            )
            metrics.prompt_tokens.inc(name, amount=usage.prompt_tokens)
            metrics.cached_tokens.inc(name, amount=usage.cached_tokens)
            metrics.completion_tokens.inc(name, amount=usage.completion_tokens)

    def _stamp(
        self, response: HttpResponseBase, call: ProxyCall, target: _Target, opened: Opened
    ) -> None:
        response["X-Request-ID"] = call.request_id
        if target.peer is None:
            response["X-Meridian-Balancer"] = self.rt.config.balancer
            response["X-Meridian-Replica"] = target.state.target_id
            return
        for name in ("X-Meridian-Balancer", "X-Meridian-Replica"):
            if name in opened.response.headers:
                response[name] = opened.response.headers[name]
        response["X-Meridian-Entry"] = self.rt.config.balancer

    def _failed(self, target: _Target, failure: UpstreamFailure) -> None:
        reason = "capacity" if failure.capacity else ("http" if failure.status else "network")
        self.rt.metrics.upstream_errors.inc(target.label, reason)
        logger.warning("attempt on %s failed: %s", target.label, failure.reason)
        if target.peer is None and failure.marks_unhealthy:
            self.rt.router.mark_failed(target.state.target_id)

    def _refusal(
        self, call: ProxyCall, *, attempts: int, last: UpstreamFailure | None
    ) -> errors.ApiError:
        model, retry = call.request.model, self.rt.config.retry_after_s
        if last is not None and not last.capacity:
            return errors.upstream_failed(model, attempts, last.reason)
        healthy, _ = self.rt.router.counts(model)
        # A peer with healthy replicas counts only if this request may still be forwarded.
        peer_busy = not call.descriptor.forwarded and self._peer_has_healthy(model)
        if healthy or (last is not None and last.capacity) or peer_busy:
            return errors.at_capacity(model, retry)
        return errors.no_healthy_replica(model, retry)

    def _peer_has_healthy(self, model: str) -> bool:
        now, ttl = time.time(), self.rt.config.heartbeat_ttl_s
        return any(
            beat.age(now) <= ttl and beat.healthy_replicas > 0 and model in beat.models
            for beat in self.rt.peers.heartbeats.values()
        )


def _usage_of(payload: bytes) -> Usage | None:
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    return Usage.from_openai(body.get("usage")) if isinstance(body, dict) else None
