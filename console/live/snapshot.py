"""One aggregated live snapshot per tick, from what the control plane can see.

Inputs are plain data gathered by ``console.live.tick``: the topology rows, each
balancer's ``GET /internal/state`` (or the error), its Redis heartbeat and the
latest region rollup (TTFT percentiles and forwarding come only from rollups).
Request rate and KV-cache hit rate are computed from the balancers' cumulative
per-replica counters, differenced against the previous tick's totals (kept by the
caller), so a browser sees the last second rather than the process lifetime.  Hit
rate is cached prompt tokens / prompt tokens, the quantity SkyLB §2.2 argues a
prefix-aware router should maximise.

Pure: no Django, no I/O, so the arithmetic is tested without a stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COUNTERS = ("requests", "prompt_tokens", "cached_tokens")


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
class TickInputs:
    now: float
    regions: list[tuple[str, str]]  # (name, display name)
    balancers: list[BalancerRow]
    replicas: list[ReplicaRow]
    states: dict[str, dict[str, Any] | None]  # balancer -> /internal/state or None
    heartbeats: dict[str, float | None]  # balancer -> heartbeat ts
    rollups: dict[str, dict[str, Any] | None]  # region -> latest rollup row
    previous: dict[str, dict[str, float]] = field(default_factory=dict)
    heartbeat_ttl_s: float = 5.0
    hourly_cost: dict[str, float] = field(default_factory=dict)  # region -> $/h billed now


def balancer_totals(state: dict[str, Any], now: float) -> dict[str, float]:
    """Sum of the counters over every replica row one balancer reports."""
    totals = {name: 0.0 for name in COUNTERS}
    for row in state.get("replicas", []):
        for name in COUNTERS:
            totals[name] += float(row.get(name) or 0)
    totals["ts"] = now
    return totals


def delta(current: dict[str, float], before: dict[str, float] | None) -> dict[str, float]:
    """Counter growth since ``before``; a restarted balancer (counters fell) counts from 0."""
    if before is None or "ts" not in before:
        return {name: 0.0 for name in (*COUNTERS, "seconds")}
    out = {"seconds": max(current["ts"] - before["ts"], 0.0)}
    for name in COUNTERS:
        grown = current[name] - before.get(name, 0.0)
        out[name] = grown if grown >= 0 else current[name]
    return out


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den > 0 else None


def _kinds(replicas: list[ReplicaRow]) -> dict[str, list[int]]:
    by_kind: dict[str, list[int]] = {}
    for replica in replicas:
        ready_total = by_kind.setdefault(replica.kind, [0, 0])
        ready_total[1] += 1
        ready_total[0] += replica.state == "ready"
    return by_kind


def _gauges(states: list[dict[str, Any]]) -> dict[str, Any]:
    waits = [q.get("oldest_wait_s", 0.0) for s in states for q in s.get("queues", [])]
    return {
        "inflight": sum(int(s.get("inflight") or 0) for s in states),
        "forwarded_inflight": sum(int(s.get("forwarded_inflight") or 0) for s in states),
        "queue": sum(int(s.get("queue") or 0) for s in states),
        "oldest_wait_s": round(max(waits), 3) if waits else 0.0,
        "waiting": sum(int(r.get("waiting") or 0) for s in states for r in s.get("replicas", [])),
    }


def _rollup_fields(rollup: dict[str, Any] | None) -> dict[str, Any]:
    if not rollup:
        return {
            "ttft_p50_s": None,
            "ttft_p90_s": None,
            "forwarded_in": 0,
            "forwarded_out": 0,
            "local_share": None,
            "rollup_end": None,
        }
    requests = int(rollup.get("requests") or 0)
    out = int(rollup.get("forwarded_out") or 0)
    # Local share: requests this region's clients sent that were served here, not
    # pushed to a peer (SkyLB §3.3 selective pushing forwards only when local is full).
    local = _ratio(max(requests - out, 0), requests) if requests else None
    return {
        "ttft_p50_s": rollup.get("ttft_p50_s"),
        "ttft_p90_s": rollup.get("ttft_p90_s"),
        "forwarded_in": int(rollup.get("forwarded_in") or 0),
        "forwarded_out": out,
        "local_share": local,
        "rollup_end": rollup.get("interval_end"),
    }


def _balancer_view(row: BalancerRow, inputs: TickInputs) -> dict[str, Any]:
    beat = inputs.heartbeats.get(row.name)
    fresh = beat is not None and inputs.now - beat <= inputs.heartbeat_ttl_s
    state = inputs.states.get(row.name)
    return {
        "name": row.name,
        "url": row.url,
        "up": bool(fresh or state is not None),
        "answering": state is not None,
        "heartbeat_age_s": round(inputs.now - beat, 2) if beat is not None else None,
        "db_state": row.db_state,
        "routes_to": sorted(r["name"] for r in (state or {}).get("replicas", [])),
    }


def region_view(
    name: str, display: str, inputs: TickInputs, deltas: dict[str, Any]
) -> dict[str, Any]:
    balancers = [b for b in inputs.balancers if b.region == name]
    states = [s for b in balancers if (s := inputs.states.get(b.name)) is not None]
    grown = {
        key: sum(deltas[b.name][key] for b in balancers if b.name in deltas) for key in COUNTERS
    }
    seconds = max((deltas[b.name]["seconds"] for b in balancers if b.name in deltas), default=0.0)
    replicas = [r for r in inputs.replicas if r.region == name and r.state != "terminated"]
    views = [_balancer_view(b, inputs) for b in balancers]
    return {
        "name": name,
        "display_name": display or name,
        "balancers": views,
        "balancer_up": any(v["up"] for v in views),
        "ready": sum(r.state == "ready" for r in replicas),
        "total": len(replicas),
        "by_kind": _kinds(replicas),
        "rps": round(grown["requests"] / seconds, 2) if seconds > 0 else None,
        "hit_rate": _ratio(grown["cached_tokens"], grown["prompt_tokens"]),
        "hourly_cost": round(inputs.hourly_cost.get(name, 0.0), 4),
        **_gauges(states),
        **_rollup_fields(inputs.rollups.get(name)),
    }


def replica_views(inputs: TickInputs) -> list[dict[str, Any]]:
    """Each replica's live numbers, from the balancer that reports it (its owner first)."""
    seen: dict[str, dict[str, Any]] = {}
    for balancer in inputs.balancers:
        for row in (inputs.states.get(balancer.name) or {}).get("replicas", []):
            seen.setdefault(row["name"], {**row, "reported_by": balancer.name})
    out = []
    for replica in inputs.replicas:
        live = seen.get(replica.name, {})
        out.append(
            {
                "name": replica.name,
                "state": replica.state,
                "owner": replica.owner,
                "reported_by": live.get("reported_by"),
                "healthy": live.get("healthy"),
                "running": live.get("running"),
                "waiting": live.get("waiting"),
                "outstanding": live.get("outstanding"),
                "kv_usage": live.get("kv_usage"),
                "hit_rate": live.get("cached_token_ratio"),
                **_anticipated(live.get("forecast")),
                # Plain-language warnings about the balancer's view of its cache
                # (KV-event stream, hit-rate mismatch): routing/views/internal.py.
                "warnings": list(live.get("warnings") or []),
            }
        )
    return out


# Points of the look-ahead sparkline: enough for its shape, small on the websocket.
SPARKLINE_POINTS = 20


def _anticipated(forecast: dict[str, Any] | None) -> dict[str, Any]:
    """The replica's PreServe look-ahead map: its peak KV tokens over the next L
    iterations and a coarse curve of it (every k-th iteration) for the sparkline."""
    if not forecast:
        return {"anticipated_peak": None, "lookahead": []}
    ahead = list(forecast.get("lookahead") or [])
    step = max(1, len(ahead) // SPARKLINE_POINTS)
    return {"anticipated_peak": forecast.get("peak_kv_tokens"), "lookahead": ahead[::step]}


def build_snapshot(inputs: TickInputs) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """(snapshot, counter totals to hand back as ``previous`` next tick)."""
    totals = {
        name: balancer_totals(state, inputs.now)
        for name, state in inputs.states.items()
        if state is not None
    }
    deltas = {name: delta(now, inputs.previous.get(name)) for name, now in totals.items()}
    snapshot = {
        "ts": inputs.now,
        "regions": [region_view(n, d, inputs, deltas) for n, d in inputs.regions],
        "replicas": replica_views(inputs),
    }
    return snapshot, totals
