"""Least load: send each request to the candidate with the fewest outstanding requests.

Outstanding means sent by this balancer and not yet finished, which is exact and
updated on every dispatch and completion, unlike probe data that is up to one
probe interval old.  Ties go to the candidate whose latest probe showed the
fewest waiting then running requests, then to the lowest id so the choice is
deterministic (tests and the simulator rely on that).  It is also the fallback
of every cache-aware policy when the cache says nothing (SkyLB §3.2, 002 §5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.policy import PolicyBase, least_loaded
from core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class LeastLoadConfig:
    pass


class LeastLoadPolicy(PolicyBase):
    name = "least_load"

    def __init__(self, config: LeastLoadConfig | None = None) -> None:
        self.config = config or LeastLoadConfig()

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        return least_loaded(candidates)
