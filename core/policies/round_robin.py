"""Round robin: cycle through the candidates in id order, ignoring load and cache.

The baseline every paper compares against.  The cursor is a counter, not an
index into one list, so it keeps cycling fairly when the candidate set changes
(a replica drained or added) instead of restarting from the first one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.policy import PolicyBase
from core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class RoundRobinConfig:
    pass


class RoundRobinPolicy(PolicyBase):
    name = "round_robin"

    def __init__(self, config: RoundRobinConfig | None = None) -> None:
        self.config = config or RoundRobinConfig()
        self._counter = 0

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        if not candidates:
            return None
        ordered = sorted(candidates, key=lambda t: t.target_id)
        choice = ordered[self._counter % len(ordered)]
        # Bounded: the counter wraps instead of growing for the life of the process.
        self._counter = (self._counter + 1) % (1 << 62)
        return choice
