"""One live snapshot for the console's pages, from the balancers' live records.

Inputs are plain data: the topology rows (regions, balancers, replicas), each
region's recent ``LiveRecord``s read from its Redis stream (``console.live.feed``) and
the hourly cost.  ``core.live_feed`` does the arithmetic (rates over the last
seconds, TTFT quantiles, per-balancer gauges); this module lays it out per region and
per replica the way the pages read it, and says since when a quiet component has
sent nothing (``last_ts``), so a page shows "no data since HH:MM:SS", never a blank.

Pure: no Django, no I/O, no clock (``now`` is given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.live_feed import (
    LiveRecord,
    last_seen,
    latest_replicas,
    region_numbers,
    replica_row,
    series,
)


@dataclass(frozen=True)
class ReplicaRow:
    name: str
    region: str
    zone: str
    kind: str
    state: str
    owner: str | None


@dataclass(frozen=True)
class BalancerRow:
    name: str
    region: str
    url: str
    db_state: str


@dataclass
class FeedInputs:
    now: float
    regions: list[tuple[str, str]]  # (name, display name)
    balancers: list[BalancerRow]
    replicas: list[ReplicaRow]
    records: Mapping[str, Sequence[LiveRecord]]  # region -> its recent records
    silent_after_s: float = 5.0  # a balancer with no record for this long is down
    hourly_cost: dict[str, float] = field(default_factory=dict)  # region -> $/h billed now


def _kinds(replicas: list[ReplicaRow]) -> dict[str, list[int]]:
    by_kind: dict[str, list[int]] = {}
    for replica in replicas:
        ready_total = by_kind.setdefault(replica.kind, [0, 0])
        ready_total[1] += 1
        ready_total[0] += replica.state == "ready"
    return by_kind


def _balancer_view(
    row: BalancerRow, seen: Mapping[str, float], inputs: FeedInputs
) -> dict[str, Any]:
    """Up while its records keep coming; ``last_ts`` says since when it went quiet."""
    last = seen.get(row.name)
    return {
        "name": row.name,
        "url": row.url,
        "up": last is not None and inputs.now - last <= inputs.silent_after_s,
        "last_ts": last,
        "db_state": row.db_state,
    }


def region_view(name: str, display: str, inputs: FeedInputs) -> dict[str, Any]:
    records = inputs.records.get(name, ())
    seen = last_seen(records)
    replicas = [r for r in inputs.replicas if r.region == name and r.state != "terminated"]
    views = [_balancer_view(b, seen, inputs) for b in inputs.balancers if b.region == name]
    numbers = region_numbers(records, inputs.now, window_s=inputs.silent_after_s)
    return {
        "name": name,
        "display_name": display or name,
        "balancers": views,
        "balancer_up": any(v["up"] for v in views),
        "ready": sum(r.state == "ready" for r in replicas),
        "total": len(replicas),
        "by_kind": _kinds(replicas),
        "hourly_cost": round(inputs.hourly_cost.get(name, 0.0), 4),
        **numbers.as_dict(),
    }


def replica_views(inputs: FeedInputs) -> list[dict[str, Any]]:
    """Each replica's live numbers, from the newest record of a balancer reporting it."""
    live = latest_replicas(r for records in inputs.records.values() for r in records)
    out = []
    for replica in inputs.replicas:
        row = replica_row(replica.name, live) or {}
        out.append(
            {
                "name": replica.name,
                "state": replica.state,
                "owner": replica.owner,
                "reported_by": row.get("reported_by"),
                "reported_at": row.get("reported_at"),
                "healthy": row.get("healthy"),
                "running": row.get("running"),
                "waiting": row.get("waiting"),
                "outstanding": row.get("outstanding"),
                "kv_usage": row.get("kv_usage"),
                "hit_rate": row.get("hit_rate"),
                "anticipated_peak": row.get("anticipated_peak"),
                "lookahead": list(row.get("lookahead") or ()),
                # Plain-language warnings about the balancer's view of its cache
                # (KV-event stream, hit-rate mismatch), as /internal/state gives them.
                "warnings": list(row.get("warnings") or ()),
            }
        )
    return out


def build_snapshot(inputs: FeedInputs) -> dict[str, Any]:
    return {
        "ts": inputs.now,
        "regions": [region_view(n, d, inputs) for n, d in inputs.regions],
        "replicas": replica_views(inputs),
    }


def history(
    regions: Sequence[str], records: Mapping[str, Sequence[LiveRecord]], *, step_s: float
) -> dict[str, dict[str, list[float | None]]]:
    """The charts' back-fill: each region's series over the records given."""
    return {name: series(records.get(name, ()), step_s=step_s) for name in regions}
