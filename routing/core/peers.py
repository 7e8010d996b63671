"""The remote layer of SkyLB's two-layer routing: which peer balancer to forward to.

Every balancer publishes a heartbeat (its availability) under
``meridian:balancer:<name>:heartbeat`` with a TTL; every balancer reads its
peers' heartbeats in the background.  A peer is *available* for a model when
its heartbeat is fresh and it reported at least one available replica of that
model (SkyLB §3.3: a balancer is available to others when it has an available
replica and its queue is under a small buffer τ).  Candidates are ranked by
round-trip time from this region, nearest first (SkyLB §3.2: serve as close to
the user as possible), then by name so the order is deterministic.

The heartbeat's JSON is the contract with the control plane and the console, so
its fields are listed once here (``Heartbeat``) and nowhere else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from routing.core.topology import PeerSpec

HEARTBEAT_KEY = "meridian:balancer:{name}:heartbeat"


def heartbeat_key(balancer: str) -> str:
    return HEARTBEAT_KEY.format(name=balancer)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    balancer: str
    region: str
    url: str
    ts: float
    healthy_replicas: int
    available_replicas: int
    inflight: int
    queue: int
    models: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "models": dict(self.models)}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Heartbeat:
        """Decode a heartbeat; ``ValueError`` when it is not one."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("heartbeat is not a JSON object")
        try:
            models = data.get("models") or {}
            return cls(
                balancer=str(data["balancer"]),
                region=str(data["region"]),
                url=str(data["url"]),
                ts=float(data["ts"]),
                healthy_replicas=int(data["healthy_replicas"]),
                available_replicas=int(data["available_replicas"]),
                inflight=int(data["inflight"]),
                queue=int(data["queue"]),
                models={str(k): int(v) for k, v in dict(models).items()},
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"heartbeat is missing or mistypes a field: {exc}") from None

    def age(self, now: float) -> float:
        return max(0.0, now - self.ts)

    def available_for(self, model: str, *, queue_buffer: int) -> bool:
        return self.models.get(model, 0) > 0 and self.queue < queue_buffer


@dataclass(frozen=True, slots=True)
class PeerCandidate:
    spec: PeerSpec
    heartbeat: Heartbeat


def rank_peers(
    peers: Iterable[PeerSpec],
    heartbeats: Mapping[str, Heartbeat],
    model: str,
    *,
    now: float,
    max_age_s: float,
    queue_buffer: int = 1,
    exclude: frozenset[str] = frozenset(),
) -> list[PeerCandidate]:
    """Available peers for ``model``, nearest first."""
    out: list[PeerCandidate] = []
    for peer in peers:
        beat = heartbeats.get(peer.name)
        if peer.name in exclude or beat is None or beat.age(now) > max_age_s:
            continue
        if beat.available_for(model, queue_buffer=queue_buffer):
            out.append(PeerCandidate(peer, beat))
    return sorted(out, key=lambda c: (_rtt(c.spec.rtt_ms), c.spec.name))


def peer_view(
    peers: Iterable[PeerSpec], heartbeats: Mapping[str, Heartbeat], *, now: float, max_age_s: float
) -> list[dict[str, Any]]:
    """Each peer as ``/internal/state`` shows it."""
    rows: list[dict[str, Any]] = []
    for peer in sorted(peers, key=lambda p: (_rtt(p.rtt_ms), p.name)):
        beat = heartbeats.get(peer.name)
        fresh = beat is not None and beat.age(now) <= max_age_s
        rows.append(
            {
                "name": peer.name,
                "region": peer.region,
                "url": peer.url,
                "rtt_ms": None if math.isinf(peer.rtt_ms) else peer.rtt_ms,
                "alive": fresh,
                "heartbeat_age_s": None if beat is None else round(beat.age(now), 3),
                "healthy_replicas": beat.healthy_replicas if fresh and beat else 0,
                "available_replicas": beat.available_replicas if fresh and beat else 0,
                "inflight": beat.inflight if fresh and beat else 0,
                "queue": beat.queue if fresh and beat else 0,
                "models": dict(beat.models) if fresh and beat else {},
            }
        )
    return rows


def _rtt(value: float) -> float:
    return math.inf if math.isnan(value) else value
