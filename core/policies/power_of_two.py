"""Power of two choices: sample two distinct candidates at random, take the less loaded.

Mitzenmacher's result: two random probes instead of one cut the maximum load
from O(log n / log log n) to O(log log n) while touching only two targets' state,
which keeps a fleet of balancers (each with a slightly stale view) from herding
onto the single globally least-loaded target the way least-load does.
The RNG is a per-policy ``random.Random`` seeded from the config, so runs are
reproducible in tests, the simulator and the benchmarks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from core.policy import PolicyBase, load_key
from core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class PowerOfTwoConfig:
    seed: int = 0


class PowerOfTwoPolicy(PolicyBase):
    name = "power_of_two"

    def __init__(self, config: PowerOfTwoConfig | None = None) -> None:
        self.config = config or PowerOfTwoConfig()
        self._rng = random.Random(self.config.seed)

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        first, second = self._rng.sample(range(len(candidates)), 2)
        return min(candidates[first], candidates[second], key=load_key)
