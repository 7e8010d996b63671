"""Least load: send each request to the candidate with the fewest outstanding requests.

Outstanding means sent by this balancer and not yet finished, which is exact and
updated on every dispatch and completion, unlike probe data that is up to one
probe interval old.  Ties go to the candidate whose latest probe showed the
fewest waiting then running requests, then to the lowest id so the choice is
deterministic (tests and the simulator rely on that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class LeastLoadConfig:
    pass


class LeastLoadPolicy:
    name = "least_load"

    def __init__(self, config: LeastLoadConfig | None = None) -> None:
        self.config = config or LeastLoadConfig()

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        if not candidates:
            return None
        return min(candidates, key=lambda t: (t.outstanding, t.waiting, t.running, t.target_id))

    def on_complete(self, request: RequestDescriptor, target: TargetState, ok: bool) -> None:
        return None
