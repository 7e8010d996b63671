"""What balancers tell each other: the ``Heartbeat`` (SkyLB §3.3 availability report).

Every balancer answers ``GET /internal/availability`` with its heartbeat and
polls its peers' on a short interval; the remote layer
(``core.remote``) routes on those polled reports.  The same JSON is
also published to Redis under ``meridian:balancer:<name>:heartbeat`` with a
TTL, for the control plane and the console; routing never depends on Redis.

A report says, per model, how many replicas are *available* under that
model's pushing rule and how many requests wait in this balancer's queue.  A
peer is available to others for a model when it has an available replica and
its queue is at most τ (Algorithm 1, line 12: unavailable when
``n_avail = 0 or size_q > τ``).

The JSON is the contract with peers, the control plane and the console, so
its fields are listed once here (``Heartbeat``) and nowhere else.  ``queues``
(per model) was added after ``queue`` (the total); a report without it is read
with an empty map, and ``queue`` then stands for every model.  ``estimates``
(per model, seconds) came later still and is likewise optional, as are
``prefill_prices`` (per model, seconds per uncached prompt token, the harm to
the requests decoding there included) and ``decode_prices`` (per model, seconds
per output token, its slowdown of the requests decoding there included), added
after it.  ``prefixes`` (per model, what the region's replicas hold: a sampled
set of chained block hashes, ``core.prefix_digest``) came last and is
optional too: a peer without it is priced from what was forwarded there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from core.prefix_digest import PrefixDigest

HEARTBEAT_KEY = "meridian:balancer:{name}:heartbeat"


def heartbeat_key(balancer: str) -> str:
    return HEARTBEAT_KEY.format(name=balancer)


SERVING_KEY = "meridian:replica:{name}:serving"


def serving_key(replica: str) -> str:
    """Set by a balancer, with what is left of the busy grace as its TTL, while
    ``replica`` answers that balancer's requests: the control plane's readiness probe
    then takes a timeout of it as lateness, not failure (``core.busy``)."""
    return SERVING_KEY.format(name=replica)


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
    # Available replicas per model.
    models: Mapping[str, int] = field(default_factory=dict)
    # Requests waiting in this balancer's queue per model.
    queues: Mapping[str, int] = field(default_factory=dict)
    # Seconds a new request would queue for prefill here, per model priced by a
    # cost model (the ``meridian`` policy); peers add it to the RTT.
    estimates: Mapping[str, float] = field(default_factory=dict)
    # Seconds one uncached prompt token costs here, per model priced by a cost
    # model: its prefill plus the delay it adds to the requests decoding here.
    prefill_prices: Mapping[str, float] = field(default_factory=dict)
    # Seconds one output token costs here (a decode step one sequence fuller, and
    # that growth of every running request's steps), per model priced likewise.
    decode_prices: Mapping[str, float] = field(default_factory=dict)
    # What the region's replicas hold, per model priced by a cost model.
    prefixes: Mapping[str, PrefixDigest] = field(default_factory=dict)

    def to_json(self) -> str:
        plain = {k: v for k, v in asdict(self).items() if k != "prefixes"}
        data = {
            **plain,
            "models": dict(self.models),
            "queues": dict(self.queues),
            "estimates": dict(self.estimates),
            "prefill_prices": dict(self.prefill_prices),
            "decode_prices": dict(self.decode_prices),
            "prefixes": {m: d.encode() for m, d in self.prefixes.items()},
        }
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Heartbeat:
        """Decode a heartbeat; ``ValueError`` when it is not one."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("heartbeat is not a JSON object")
        try:
            return cls(
                balancer=str(data["balancer"]),
                region=str(data["region"]),
                url=str(data["url"]),
                ts=float(data["ts"]),
                healthy_replicas=int(data["healthy_replicas"]),
                available_replicas=int(data["available_replicas"]),
                inflight=int(data["inflight"]),
                queue=int(data["queue"]),
                models=_counts(data.get("models")),
                queues=_counts(data.get("queues")),
                estimates=_seconds(data.get("estimates")),
                prefill_prices=_seconds(data.get("prefill_prices")),
                decode_prices=_seconds(data.get("decode_prices")),
                prefixes=_digests(data.get("prefixes")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"heartbeat is missing or mistypes a field: {exc}") from None

    def age(self, now: float) -> float:
        return max(0.0, now - self.ts)

    def queue_for(self, model: str) -> int:
        return self.queues.get(model, self.queue)

    def available_for(self, model: str, *, queue_buffer: int) -> bool:
        """Algorithm 1, line 12: an available replica and a queue of at most τ."""
        return self.models.get(model, 0) > 0 and self.queue_for(model) <= queue_buffer


def _counts(raw: object) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TypeError(f"expected an object of counts, got {type(raw).__name__}")
    return {str(k): int(v) for k, v in raw.items()}


def _digests(raw: object) -> dict[str, PrefixDigest]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TypeError(f"expected an object of prefix digests, got {type(raw).__name__}")
    return {str(k): PrefixDigest.decode(v) for k, v in raw.items()}


def _seconds(raw: object) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TypeError(f"expected an object of seconds, got {type(raw).__name__}")
    return {str(k): float(v) for k, v in raw.items()}
