"""The console's WebSocket: one staff-only consumer per browser page.

It joins the events and drills groups in ``connect`` (after checking the session's
user is active staff; anyone else is closed with 4403 before the handshake is
accepted) and forwards each group message to the browser as ``{"kind": ...,
...payload}`` (an Event under ``"event"``: it has a kind of its own).  One handler per
message type, named after it.

Live numbers do not come through the channel layer: the consumer's own task reads
the balancers' live streams (``console.live.feed``), sends the charts' 15-minute
back-fill once (``{"kind": "history"}``) and then a snapshot every
``MERIDIAN_LIVE_PERIOD_S``.  A Redis or database hiccup costs that tick, logged as one
line; the socket stays open and the next tick catches up from the streams.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError
from redis.exceptions import RedisError

from console.live.feed import FeedReader, Topology, topology_rows
from console.live.messages import ALL_GROUPS
from console.live.publish import recent_drill_lines
from console.live.snapshot import FeedInputs, build_snapshot, history

logger = logging.getLogger(__name__)

FORBIDDEN = 4403
# The charts' back-fill: one point per this many seconds over the last 15 minutes.
HISTORY_STEP_S = 5.0
# A live read must not outlast its tick.
REDIS_TIMEOUT_S = 2.0


class LiveConsumer(AsyncJsonWebsocketConsumer):
    groups: list[str] = []  # joined by hand in connect, only after the staff check

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_active or not user.is_staff:
            await self.close(code=FORBIDDEN)
            return
        for group in ALL_GROUPS:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        self.feed_task: asyncio.Task[None] | None = asyncio.create_task(self.run_feed())

    async def disconnect(self, code: int) -> None:
        task = getattr(self, "feed_task", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for group in ALL_GROUPS:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def run_feed(self) -> None:
        """Back-fill once, then a snapshot per period, until the socket closes."""
        client = aioredis.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
        )
        reader = FeedReader(client)
        backfilled = False
        failing = False
        try:
            while True:
                try:
                    topology = await database_sync_to_async(topology_rows)()
                    if not backfilled:
                        await self.send_history(reader, topology)
                        await self.send_recent_drills()
                        backfilled = True
                    else:
                        await reader.poll([name for name, _ in topology[0]], time.time())
                    await self.send_snapshot(reader, topology)
                    if failing:
                        logger.info("live feed readable again")
                    failing = False
                except (RedisError, OSError, DatabaseError) as exc:
                    if not failing:
                        logger.warning("live feed tick skipped: %s", exc)
                    failing = True
                await asyncio.sleep(settings.MERIDIAN_LIVE_PERIOD_S)
        finally:
            await client.aclose()

    async def send_recent_drills(self) -> None:
        """The drill lines published before this socket joined the drills group (a
        drill started from the console publishes its first ones before the page its
        POST redirects to connects).  The group was joined first, so a line published
        since may come twice; the page drops the repeat by ``run`` and ``seq``."""
        for line in recent_drill_lines():
            await self.send_json({"kind": "drill", **line})

    async def send_history(self, reader: FeedReader, topology: Topology) -> None:
        regions = [name for name, _ in topology[0]]
        records = await reader.backfill(regions, time.time())
        payload = history(regions, records, step_s=HISTORY_STEP_S)
        await self.send_json({"kind": "history", "step_s": HISTORY_STEP_S, "regions": payload})

    async def send_snapshot(self, reader: FeedReader, topology: Topology) -> None:
        regions, balancers, replicas, cost = topology
        inputs = FeedInputs(
            now=time.time(),
            regions=regions,
            balancers=balancers,
            replicas=replicas,
            records=reader.records,
            silent_after_s=settings.MERIDIAN_LIVE_SILENT_AFTER_S,
            hourly_cost=cost,
        )
        await self.send_json({"kind": "snapshot", **build_snapshot(inputs)})

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The socket is one-way; actions are CSRF-checked POSTs, never socket frames.
        if content == {"kind": "ping"}:
            await self.send_json({"kind": "pong"})

    async def event_created(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": "event", "event": event["payload"]})

    async def drill_progress(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": "drill", **event["payload"]})
