"""Consistent hashing on the session key: one user's requests stay on one target.

The baseline "CH" of SkyLB's evaluation (§5.1): a ring hash (``HashRing``, with
``vnodes`` virtual nodes per target) keyed by the request's session key (the
OpenAI ``user`` field or the balancer's session header).  Requests of one
session share their history as a prefix, so keeping them together reuses KV
cache implicitly, and adding or removing one of N targets remaps only ~1/N of
the sessions.

The ring holds every *known* target (``on_targets_changed``), not just today's
candidates, so a target that is briefly busy does not reshuffle every session.
When the owner is not a candidate the walk continues clockwise to the next
point whose target is, as ring-hash load balancers do for an unhealthy host.
A request without a session key has no affinity to keep and goes to the least
loaded candidate.  A candidate the ring has never heard of (the balancer did
not announce it yet) is added on sight, so the policy never depends on the
call order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.hash_ring import DEFAULT_VNODES, HashRing, stable_hash
from core.policy import PolicyBase, least_loaded
from core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class ConsistentHashConfig:
    vnodes: int = DEFAULT_VNODES


class RingPolicy(PolicyBase):
    """Shared ring upkeep and availability-skipping lookup for the ring policies."""

    def __init__(self, vnodes: int) -> None:
        self.ring = HashRing(vnodes=vnodes)

    def on_targets_changed(self, target_ids: Sequence[str]) -> None:
        self.ring.rebuild(target_ids)

    def key_hash(self, request: RequestDescriptor) -> int | None:
        """The ring position of ``request``; None when it has no affinity key."""
        return stable_hash(request.session_key) if request.session_key else None

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        key = self.key_hash(request)
        if key is None or not candidates:
            return least_loaded(candidates)
        by_id = {t.target_id: t for t in candidates}
        if not self.ring.targets.issuperset(by_id):
            self.ring.add(by_id)
        chosen = self.ring.lookup(key, by_id.__contains__)
        return by_id[chosen] if chosen is not None else None


class ConsistentHashPolicy(RingPolicy):
    name = "consistent_hash"

    def __init__(self, config: ConsistentHashConfig | None = None) -> None:
        self.config = config or ConsistentHashConfig()
        super().__init__(self.config.vnodes)
