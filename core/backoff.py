"""How long a retry waits before it goes out: exponential backoff with full jitter.

When a replica breaks, every request on it fails at once; retried at once, they
land together on the next replica and, when the failure is shared (a network
blip, a replica restarting), fail together again.  Each retry instead waits a
random time in ``[0, min(max_s, base_s * 2**(n-1)))`` for its ``n``-th retry
("full jitter": spreads a burst of retries best for the least total wait).

Pure: the randomness is a source the caller injects (a seeded ``random.Random``
by default), so the dispatch core stays deterministic under test and in the
simulator.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


def _seeded() -> Callable[[], float]:
    return random.Random(0).random


@dataclass(frozen=True, slots=True)
class RetryBackoff:
    """``base_s``: the first retry's ceiling; ``max_s``: the cap as it doubles;
    ``uniform``: a source of floats in [0, 1)."""

    base_s: float = 0.025
    max_s: float = 0.5
    uniform: Callable[[], float] = field(default_factory=_seeded)

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.max_s < self.base_s:
            raise ValueError("need 0 <= base_s <= max_s")

    def ceiling(self, retry: int) -> float:
        """The longest wait before the ``retry``-th retry (1 for the first)."""
        return min(self.max_s, self.base_s * 2.0 ** max(0, retry - 1))

    def delay(self, retry: int) -> float:
        return self.uniform() * self.ceiling(retry)


NO_BACKOFF = RetryBackoff(base_s=0.0, max_s=0.0)
