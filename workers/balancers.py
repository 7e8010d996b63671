"""Balancer liveness for the console and the controller, from the balancers' own heartbeats.

Each balancer writes a heartbeat with a TTL into Redis (``core.peers``).  Here
the control plane turns "is there a fresh heartbeat?" into the durable
``Balancer.state`` and an Event on every up/down transition.  A balancer whose key
has expired or whose timestamp is older than ``max_age_s`` is down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from core.peers import Heartbeat, heartbeat_key
from fleet.models import Balancer, Event


@dataclass(frozen=True)
class BalancerTransition:
    balancer: str
    old_state: str
    new_state: str


def read_heartbeats(client: redis.Redis, names: list[str]) -> dict[str, Heartbeat]:
    raw_values = client.mget([heartbeat_key(name) for name in names]) if names else []
    beats = {}
    for name, raw in zip(names, raw_values, strict=True):
        if raw is None:
            continue
        try:
            beats[name] = Heartbeat.from_json(raw)
        except ValueError:
            continue  # a corrupt beat is no beat: the balancer will be reported down
    return beats


def sync_balancer_states(client: redis.Redis, *, max_age_s: float) -> list[BalancerTransition]:
    balancers = list(Balancer.objects.all())
    beats = read_heartbeats(client, [b.name for b in balancers])
    now = time.time()
    transitions = []
    for balancer in balancers:
        beat = beats.get(balancer.name)
        alive = beat is not None and beat.age(now) <= max_age_s
        new_state = Balancer.State.UP if alive else Balancer.State.DOWN
        if beat is not None:
            balancer.last_heartbeat = datetime.fromtimestamp(beat.ts, tz=UTC)
        if new_state != balancer.state:
            transitions.append(BalancerTransition(balancer.name, balancer.state, new_state))
            _record(balancer, new_state, beat)
            balancer.state = new_state
        balancer.save(update_fields=["state", "last_heartbeat"])
    return transitions


def _record(balancer: Balancer, new_state: str, beat: Heartbeat | None) -> None:
    if new_state == Balancer.State.UP:
        Event.record("balancer_up", f"{balancer.name} is sending heartbeats", subject=balancer.name)
        return
    # An expired heartbeat is gone from Redis; the last one seen is in the database.
    seen = datetime.fromtimestamp(beat.ts, tz=UTC) if beat is not None else balancer.last_heartbeat
    last = seen.isoformat() if seen is not None else "never"
    Event.record(
        "balancer_down",
        f"{balancer.name} missed its heartbeats (last: {last})",
        subject=balancer.name,
        severity=Event.Severity.ERROR,
        last_heartbeat=None if seen is None else seen.isoformat(),
    )
