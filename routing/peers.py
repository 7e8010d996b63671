"""How balancers learn about each other: HTTP availability polls, Redis heartbeats.

Routing (SkyLB §3.3, Algorithm 1 lines 9-15) runs on ``AvailabilityPoller``:
every ``MERIDIAN_AVAILABILITY_INTERVAL_S`` it GETs each peer's
``/internal/availability`` (token-protected with ``MERIDIAN_INTERNAL_TOKEN``)
concurrently on the shared client and hands each answer, a ``Heartbeat``, to
the remote layer (``RemoteRouter.record_report``), which wakes the regional
queue.  A peer that does not answer keeps its last report until that ages out
(``MERIDIAN_AVAILABILITY_TTL_S``), so a dead region stops receiving forwards
within the TTL; there is no extra dependency on the routing path.

``PeerDirectory`` also publishes the same heartbeat to Redis (SET with a TTL of
``MERIDIAN_HEARTBEAT_TTL_S``) and reads the peers' keys, for the control plane
and the console.  In the same round trip it marks each replica still answering this
balancer's requests as serving (``core.busy``), so the control plane's readiness
probe does not fail a replica that is only too busy to answer it in time.  When
Redis is down the balancer logs once per outage, counts the error and retries every
interval; cross-region routing does not notice.
Socket timeouts are bounded by the interval so a black-holed Redis cannot stall
the loop.

The poller fetches through a ``ReportFetch`` (``HttpReportFetch`` in
production), which the partition drill's fault wraps
(``routing.transport.PartitionedPolls``): the poller has no branch for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import httpx
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from core.peers import Heartbeat, heartbeat_key, serving_key
from core.remote import PeerLink, RemoteRouter
from core.topology import PeerSpec
from routing.upstream import join_url

logger = logging.getLogger(__name__)

AVAILABILITY_PATH = "/internal/availability"


# A peer's availability report; ``httpx.HTTPError`` or ``ValueError`` when there is none.
ReportFetch = Callable[[PeerSpec], Awaitable[Heartbeat]]


# The most of a peer's report this balancer reads.  A report is a few hundred bytes
# per model plus its prefix digest: 4,096 hashes (about 44 KB in base64) in steady
# state, at most ``MAX_WIRE_HASHES`` (about 700 KB) where a peer is configured for
# more.  8 MiB holds a dozen models at that most, and bounds what a peer that is
# broken (or not a balancer) can make every poll buffer.
MAX_REPORT_BYTES = 8 << 20


class HttpReportFetch:
    """GETs a peer's ``/internal/availability`` on the shared client."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        token: str,
        timeout_s: float,
        max_bytes: int = MAX_REPORT_BYTES,
    ) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self._headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"}

    async def __call__(self, peer: PeerSpec) -> Heartbeat:
        url = join_url(peer.url, AVAILABILITY_PATH)
        async with self.client.stream(
            "GET", url, headers=self._headers, timeout=self.timeout_s
        ) as response:
            response.raise_for_status()
            body = await read_at_most(response, self.max_bytes)
        return Heartbeat.from_json(body)


async def read_at_most(response: httpx.Response, limit: int) -> bytes:
    """The whole body, or ``ValueError`` once it passes ``limit`` bytes (said by its
    ``Content-Length`` or counted as it arrives): the rest is never read."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ValueError(f"report of {declared} bytes is over the {limit}-byte limit")
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ValueError(f"report is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


class AvailabilityPoller:
    """Polls every peer's availability report for the remote layer."""

    def __init__(
        self, fetch: ReportFetch, remote: RemoteRouter, *, on_error: Callable[[str], None]
    ) -> None:
        self.fetch = fetch
        self.remote = remote
        self.on_error = on_error
        self.last_errors: dict[str, str] = {}

    async def poll_all(self) -> None:
        links = self.remote.links()
        if links:
            await asyncio.gather(*(self.poll(link) for link in links))

    async def poll(self, link: PeerLink) -> None:
        name = link.spec.name
        try:
            report = await self.fetch(link.spec)
        except (httpx.HTTPError, ValueError) as exc:
            self.on_error(name)
            if name not in self.last_errors:
                logger.warning("availability of peer %s unknown: %s", name, exc)
            self.last_errors[name] = str(exc) or type(exc).__name__
            return
        if self.last_errors.pop(name, None) is not None:
            logger.info("availability of peer %s known again", name)
        self.remote.record_report(name, report)


class PeerDirectory:
    def __init__(self, redis_url: str, *, interval_s: float, ttl_s: float) -> None:
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        timeout = max(0.2, min(interval_s, 2.0))
        self._redis = aioredis.Redis.from_url(
            redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self.heartbeats: dict[str, Heartbeat] = {}
        self.connected = False
        self.last_error: str | None = None

    async def exchange(
        self,
        mine: Heartbeat,
        peer_names: Sequence[str],
        on_error: Callable[[], None],
        serving: Mapping[str, float] | None = None,
    ) -> None:
        """One round, one round trip: publish our heartbeat and, for each replica in
        ``serving``, its serving mark for the seconds of busy grace it has left
        (``core.peers.serving_key``); then refresh what we know of the peers."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.set(heartbeat_key(mine.balancer), mine.to_json(), px=int(self.ttl_s * 1000))
                for replica, left_s in (serving or {}).items():
                    pipe.set(serving_key(replica), mine.balancer, px=max(1, int(left_s * 1000)))
                if peer_names:
                    pipe.mget([heartbeat_key(n) for n in peer_names])
                replies = await pipe.execute()
            raw = replies[-1] if peer_names else []
        except (RedisError, OSError) as exc:
            on_error()
            if self.connected or self.last_error is None:
                logger.warning("heartbeat: Redis unavailable (%s); serving locally only", exc)
            self.connected = False
            self.last_error = str(exc) or type(exc).__name__
            return
        if not self.connected and self.last_error is not None:
            logger.info("heartbeat: Redis reachable again")
        self.connected, self.last_error = True, None
        self.heartbeats = self._decode(peer_names, raw)

    def _decode(
        self, names: Sequence[str], raw: Sequence[bytes | str | None]
    ) -> dict[str, Heartbeat]:
        beats: dict[str, Heartbeat] = {}
        for name, value in zip(names, raw, strict=True):
            if value is None:
                continue
            try:
                beats[name] = Heartbeat.from_json(value)
            except ValueError as exc:
                logger.warning("heartbeat of %s is malformed, ignored: %s", name, exc)
        return beats

    async def close(self) -> None:
        await self._redis.aclose()
