"""Nearest: the remote-layer default, lowest round-trip time from this region first.

SkyLB §3.1: a request should be served as close to its user as possible, so
when no local replica is available the balancer forwards to the nearest
*available* peer balancer.  Peers carry their RTT in
``TargetState.extra["rtt_ms"]`` (from the ``RegionLatency`` topology rows); a
peer without one counts as infinitely far.  Ties go to the peer with the fewest
outstanding forwarded requests, then to the lowest id.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from core.policy import PolicyBase
from core.types import RequestDescriptor, TargetState

RTT_KEY = "rtt_ms"


@dataclass(frozen=True, slots=True)
class NearestConfig:
    pass


def rtt_ms(target: TargetState) -> float:
    value = target.extra.get(RTT_KEY, math.inf)
    return math.inf if math.isnan(value) else value


class NearestPolicy(PolicyBase):
    name = "nearest"

    def __init__(self, config: NearestConfig | None = None) -> None:
        self.config = config or NearestConfig()

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        return min(candidates, key=lambda t: (rtt_ms(t), t.outstanding, t.target_id), default=None)
