"""The console's side of the live feed: read the regions' streams, keep what is recent.

Each balancer appends a ``LiveRecord`` a second to ``meridian:live:region:<region>``
(``routing.live_publish``).  A ``FeedReader`` belongs to one console WebSocket: on
connect it reads the last ``BACKFILL_S`` of every region's stream (the charts' 15
minutes, and the newest record even if it is older, so a quiet region says since
when), then each second only what was appended since, by stream id.  Nothing here
polls a balancer or waits on a Celery task, so the console stays live exactly when
the machine is busy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import redis
import redis.asyncio as aioredis
from django.utils import timezone

from console.live.snapshot import BalancerRow, ReplicaRow
from core.live_feed import FIELD, LiveRecord, decode_all, latest_replicas, stream_key
from fleet.models import Balancer, Region, Replica
from workers.cost import hourly_cost_by_region

# The charts' live window, read from the streams when a page opens.
BACKFILL_S = 15 * 60
# Records older than this are dropped from memory (rates need the last seconds), except
# each balancer's newest, which says since when it is quiet.
KEEP_S = 60.0


def _ms_id(seconds: float) -> str:
    return str(int(seconds * 1000))


# A stream's entries as redis-py returns them (bytes: the client does not decode).
Entries = list[tuple[bytes, dict[bytes, bytes]]]


def _decode(entries: Entries) -> list[LiveRecord]:
    return decode_all(fields[FIELD.encode()] for _, fields in entries if FIELD.encode() in fields)


class FeedReader:
    """The recent records of each region, kept current by ``poll``."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.records: dict[str, list[LiveRecord]] = {}
        self._last_id: dict[str, bytes] = {}

    async def backfill(self, regions: Sequence[str], now: float) -> dict[str, list[LiveRecord]]:
        """Every region's records of the last ``BACKFILL_S`` (or its newest one)."""
        out: dict[str, list[LiveRecord]] = {}
        for region in regions:
            key = stream_key(region)
            entries = cast(Entries, await self.client.xrange(key, min=_ms_id(now - BACKFILL_S)))
            if not entries:
                entries = cast(Entries, await self.client.xrevrange(key, count=1))
            if entries:
                self._last_id[region] = max(entry_id for entry_id, _ in entries)
            out[region] = _decode(entries)
            self.records[region] = list(out[region])
        self.prune(now)
        return out

    async def poll(self, regions: Sequence[str], now: float) -> None:
        """Append what each region's stream received since the last read."""
        for region in regions:
            last = self._last_id.get(region)
            start = b"(" + last if last else _ms_id(now - KEEP_S)
            entries = cast(Entries, await self.client.xrange(stream_key(region), min=start))
            if entries:
                self._last_id[region] = entries[-1][0]
                self.records.setdefault(region, []).extend(_decode(entries))
        self.prune(now)

    def prune(self, now: float) -> None:
        for region, records in self.records.items():
            newest: dict[str, LiveRecord] = {}
            for record in records:
                known = newest.get(record.balancer)
                if known is None or record.ts > known.ts:
                    newest[record.balancer] = record
            kept = [r for r in records if now - r.ts <= KEEP_S]
            kept_ids = {id(r) for r in kept}
            stale_newest = [r for r in newest.values() if id(r) not in kept_ids]
            self.records[region] = sorted([*stale_newest, *kept], key=lambda r: r.ts)


Topology = tuple[list[tuple[str, str]], list[BalancerRow], list[ReplicaRow], dict[str, float]]


def topology_rows() -> Topology:
    """Regions, balancers, replicas and each region's $/h now (sync: the ORM)."""
    regions = [(r.name, r.display_name) for r in Region.objects.all()]
    balancers = [
        BalancerRow(b.name, b.region.name, b.url, b.state)
        for b in Balancer.objects.select_related("region")
    ]
    replicas = [
        ReplicaRow(
            r.name,
            r.region.name,
            r.zone.name,
            r.kind,
            r.state,
            r.balancer.name if r.balancer else None,
        )
        for r in Replica.objects.select_related("region", "zone", "balancer")
    ]
    cost = {region: float(rate) for region, rate in hourly_cost_by_region(timezone.now()).items()}
    return regions, balancers, replicas, cost


# How many of a region's newest records the replicas page reads for its warnings:
# one round of every balancer of a region, with room to spare.
WARNINGS_RECORDS = 32


def latest_warnings(client: redis.Redis, regions: Sequence[str]) -> dict[str, list[dict[str, str]]]:
    """Replica name -> its warnings in the newest record that reports it (sync, for
    pages rendered before their first live message)."""
    records: list[LiveRecord] = []
    for region in regions:
        entries = cast(Entries, client.xrevrange(stream_key(region), count=WARNINGS_RECORDS))
        records.extend(_decode(entries))
    return {
        name: [dict(w) for w in row.warnings]
        for name, (_, _, row) in latest_replicas(records).items()
        if row.warnings
    }
