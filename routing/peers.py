"""Balancer heartbeats through Redis: publish ours, read our peers'.

Every ``MERIDIAN_HEARTBEAT_INTERVAL_S`` the balancer SETs its ``Heartbeat``
(``routing.core.peers``) with a TTL of ``MERIDIAN_HEARTBEAT_TTL_S`` and MGETs its
peers' keys (names come from the topology snapshot, so no SCAN).  The request
path only reads ``PeerDirectory.heartbeats`` from memory.

Redis is an optimisation for *cross-region* routing only: when it is down the
balancer logs once per outage, counts the error, keeps serving locally, and
retries every interval.  Peer heartbeats it already holds age out on their own
(``rank_peers`` drops beats older than the TTL), so a balancer that cannot see
Redis stops forwarding rather than forwarding on stale news.  Socket timeouts
are bounded by the interval so a black-holed Redis cannot stall the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from routing.core.peers import Heartbeat, heartbeat_key

logger = logging.getLogger(__name__)


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
        self, mine: Heartbeat, peer_names: Sequence[str], on_error: Callable[[], None]
    ) -> None:
        """One round: publish our heartbeat, then refresh what we know of the peers."""
        try:
            await self._redis.set(
                heartbeat_key(mine.balancer), mine.to_json(), px=int(self.ttl_s * 1000)
            )
            raw = (
                await self._redis.mget([heartbeat_key(n) for n in peer_names]) if peer_names else []
            )
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
