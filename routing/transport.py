"""How the dispatcher reaches a target: one ``Transport``, and wrappers around it.

The dispatcher builds an ``UpstreamRequest`` (a replica's OpenAI endpoint, or a
peer balancer's for a forward) and opens it through a ``Transport``: the answer
is an ``Opened`` response whose first body byte has arrived, or an
``UpstreamFailure``.  Production's transport is ``PoolTransport``, the relay's
keep-alive pool.  What is not the network's own doing wraps it, so neither the
dispatcher nor the availability poller has a branch for it:

* ``PartitionFault``: the partition drill (``POST /internal/faults``, a
  ``PeerPartition``).  A forward to a partitioned peer fails before a byte is
  sent, as over a cut network, so the request moves on to another target;
  ``PartitionedPolls`` makes the availability polls of that peer fail the same
  way, so the remote layer ages its report out as it would for a dead region.
  The fault expires on its own at ``until`` (wall clock), so a drill that dies
  cannot leave a region cut off.
* ``DemoLatency``: the demo runs every region on one machine, so it charges
  the configured inter-region RTT on a forward itself: half before the request
  is sent, half before the first byte is relayed back, and TTFT grows by one
  RTT as it would across regions.  Production does not sleep: the network
  already charges it.

``routing.runtime`` composes ``PoolTransport`` → ``PartitionFault`` →
``DemoLatency`` (the last in demo mode only).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from core.peers import Heartbeat
from core.topology import PeerSpec
from routing.peers import ReportFetch
from routing.upstream import Opened, UpstreamFailure, open_upstream
from routing.upstream_pool import UpstreamPool

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """One attempt's POST; ``peer`` is set when it forwards to a peer balancer."""

    url: str
    body: bytes
    headers: Mapping[str, str]
    peer: PeerSpec | None = None


class Transport(Protocol):
    async def open(self, request: UpstreamRequest) -> Opened:
        """The response once its first body byte arrived; ``UpstreamFailure`` before."""
        ...


class PoolTransport:
    """Production's transport: the relay's keep-alive pool (``routing.upstream_pool``)."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool

    async def open(self, request: UpstreamRequest) -> Opened:
        return await open_upstream(self.pool, request.url, request.body, request.headers)


@dataclass
class PeerPartition:
    """Peers this balancer must treat as unreachable until ``until`` (epoch seconds)."""

    peers: frozenset[str] = frozenset()
    until: float = 0.0

    def set(self, peers: Iterable[str], until: float) -> None:
        self.peers, self.until = frozenset(peers), until

    def active(self, now: float | None = None) -> frozenset[str]:
        if self.peers and (time.time() if now is None else now) >= self.until:
            self.peers, self.until = frozenset(), 0.0  # expired: heal on its own
        return self.peers

    def blocks(self, peer: str) -> bool:
        return peer in self.active()

    def view(self) -> dict[str, Any]:
        peers = self.active()
        return {"partition": sorted(peers), "until": self.until if peers else None}


class PartitionFault:
    """Forwards to partitioned peers fail before a byte is sent, as a cut network."""

    def __init__(self, inner: Transport, partition: PeerPartition) -> None:
        self.inner = inner
        self.partition = partition

    async def open(self, request: UpstreamRequest) -> Opened:
        peer = request.peer
        if peer is not None and self.partition.blocks(peer.name):
            raise UpstreamFailure(f"peer {peer.name} unreachable (partitioned)")
        return await self.inner.open(request)


class PartitionedPolls:
    """Availability polls of partitioned peers fail as unreachable ones do."""

    def __init__(self, inner: ReportFetch, partition: PeerPartition) -> None:
        self.inner = inner
        self.partition = partition

    async def __call__(self, peer: PeerSpec) -> Heartbeat:
        if self.partition.blocks(peer.name):
            raise httpx.ConnectError(f"partitioned from {peer.name} (drill)")
        return await self.inner(peer)


class DemoLatency:
    """Half a forward's RTT on the way out and half on the first byte's way back."""

    def __init__(self, inner: Transport, sleep: Sleep = asyncio.sleep) -> None:
        self.inner = inner
        self.sleep = sleep  # a seam: tests observe the wait without waiting

    async def open(self, request: UpstreamRequest) -> Opened:
        half = _half_rtt_s(request.peer)
        if half is None:
            return await self.inner.open(request)
        await self.sleep(half)
        opened = await self.inner.open(request)
        try:
            await self.sleep(half)
        except BaseException:
            # The client left meanwhile: the peer must see the disconnect.
            await opened.response.aclose()
            raise
        return opened


def _half_rtt_s(peer: PeerSpec | None) -> float | None:
    if peer is None or not math.isfinite(peer.rtt_ms) or peer.rtt_ms <= 0:
        return None
    return peer.rtt_ms / 2000.0
