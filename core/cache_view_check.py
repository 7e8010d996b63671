"""Does the balancer's cache view match what the engine reports?  The mismatch detector (pure).

When a request is sent to a replica, the cache map says how many of its prompt
blocks that replica holds: the longest run of the request's block keys the
replica has *confirmed* by KV events (speculative entries are guesses, not
reports).  Times the block size, that is the number of cached prompt tokens
routing expected.  When the request completes, the engine reports in usage
how many it really found (``prompt_tokens_details.cached_tokens``).

One request may differ for honest reasons (an eviction in flight, a prompt
still being prefilled by a neighbour).  A *sustained* difference means the view
itself is wrong: the balancer's block keys are not the engine's (a different
hash scheme, seed or block size), the prompt is tokenized or templated
differently, or the event stream was lost.  So each replica keeps a sliding
window of its last ``window`` requests; a request is a miss when
``|expected - reported|`` is more than ``tolerance_blocks`` blocks, and once at
least ``min_requests`` are in the window, a miss share above ``threshold`` puts
the replica in the ``mismatch`` state (and back to ``ok`` once it falls under).

vLLM never reports the last prompt token as cached (one token must be computed
to sample from), so a prompt cached in full reports up to one block less than
its blocks; the expectation applies the same cap.  Only replicas with an event
stream are checked: without one the map knows nothing to compare.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from core.cache_map import CacheMap
from core.kv_stream_health import STATE_ADVICE, StreamState


class ViewState(StrEnum):
    WARMING = "warming"  # fewer than min_requests checked so far
    OK = "ok"
    MISMATCH = "mismatch"


MISMATCH_ADVICE = (
    "The cached tokens this replica reports do not match what the balancer's cache "
    "map expected, so prefix-aware routing is working from a wrong picture. Check "
    "that the balancer hashes blocks like the engine (hash seed, block size), uses "
    "the model's tokenizer and chat template, and receives the replica's KV events; "
    "start vLLM with --enable-prompt-tokens-details so usage carries cached_tokens."
)


@dataclass(frozen=True, slots=True)
class MismatchConfig:
    window: int = 50
    min_requests: int = 10
    threshold: float = 0.5
    tolerance_blocks: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_requests <= self.window:
            raise ValueError("need 1 <= min_requests <= window")
        if not 0.0 <= self.threshold < 1.0 or self.tolerance_blocks < 0:
            raise ValueError("threshold must be in [0, 1), tolerance_blocks >= 0")


def confirmed_prefix_blocks(cache_map: CacheMap, replica: str, keys: Sequence[int]) -> int:
    """Leading blocks of ``keys`` that ``replica`` has confirmed holding."""
    count = 0
    for key in keys:
        if replica not in cache_map.holders(key) or cache_map.is_speculative(replica, key):
            break
        count += 1
    return count


def expected_cached_tokens(blocks: int, block_size: int, prompt_tokens: int) -> int:
    """Tokens an engine should report cached for ``blocks`` held blocks of a prompt."""
    computable = max(prompt_tokens - 1, 0) // block_size * block_size
    return min(blocks * block_size, computable)


@dataclass
class ReplicaCheck:
    """One replica's window of recent comparisons and its lifetime totals."""

    misses: deque[bool]
    state: ViewState = ViewState.WARMING
    expected_tokens: int = 0
    reported_tokens: int = 0
    checked: int = 0

    @property
    def ratio(self) -> float:
        return sum(self.misses) / len(self.misses) if self.misses else 0.0


@dataclass
class MismatchDetector:
    config: MismatchConfig = field(default_factory=MismatchConfig)
    _replicas: dict[str, ReplicaCheck] = field(default_factory=dict)

    def observe(
        self, replica: str, *, expected: int, reported: int, block_size: int
    ) -> tuple[ViewState, ViewState]:
        """Record one completed request; (state before, state after)."""
        check = self._replicas.get(replica)
        if check is None:
            check = self._replicas[replica] = ReplicaCheck(deque(maxlen=self.config.window))
        check.misses.append(abs(expected - reported) > self.config.tolerance_blocks * block_size)
        check.expected_tokens += expected
        check.reported_tokens += reported
        check.checked += 1
        before, check.state = check.state, self._state(check)
        return before, check.state

    def _state(self, check: ReplicaCheck) -> ViewState:
        if len(check.misses) < self.config.min_requests:
            return ViewState.WARMING
        return ViewState.MISMATCH if check.ratio > self.config.threshold else ViewState.OK

    def check(self, replica: str) -> ReplicaCheck | None:
        return self._replicas.get(replica)

    def items(self) -> list[tuple[str, ReplicaCheck]]:
        return sorted(self._replicas.items())

    def retain(self, replicas: Iterable[str]) -> None:
        """Forget replicas that left the topology (bounded state)."""
        keep = set(replicas)
        for name in [r for r in self._replicas if r not in keep]:
            del self._replicas[name]


def replica_warnings(
    stream: StreamState | None, view: Mapping[str, object] | None
) -> list[dict[str, str]]:
    """The plain-language warnings about a replica's cache view, with what to fix: its
    KV-event ``stream`` state when not OK, and the mismatch ``view``'s advice.  One
    definition for ``/internal/state`` and the live feed the console reads."""
    warnings = []
    if stream is not None and stream is not StreamState.OK:
        warnings.append({"kind": f"kv_stream_{stream}", "message": STATE_ADVICE[stream]})
    if view is not None and view.get("advice"):
        warnings.append({"kind": "cache_view_mismatch", "message": str(view["advice"])})
    return warnings
