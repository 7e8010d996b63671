"""Does the balancer's cache view match what the engine reports?  The mismatch detector (pure).

When a request is sent to a replica, the cache map says how many of its prompt
blocks that replica holds: the longest run of the request's block keys the
replica has *confirmed* by KV events (speculative entries are guesses, not
reports).  Times the block size, that is the number of cached prompt tokens
routing expected.  When the request completes, the engine reports in usage
how many it really found (``prompt_tokens_details.cached_tokens``).

One request may differ for honest reasons (a prompt still being prefilled by a
neighbour).  A *sustained* difference means the view itself is wrong: the
balancer's block keys are not the engine's (a different hash scheme, seed or
block size), the prompt is tokenized or templated differently, or the event
stream was lost.  So each replica keeps a sliding window of its last ``window``
requests; a request is a miss when ``|expected - reported|`` is more than
``tolerance_blocks`` blocks, and once at least ``min_requests`` are in the window,
a miss share above ``threshold`` puts the replica in the ``mismatch`` state (and
back to ``ok`` once it falls under).

Except where the engine found less because it evicted the prefix after the
request was routed: the engine's own ``BlockRemoved`` event for the first expected
block it did not find arrived since (``core.eviction_log``; an engine evicts a
freed prefix from its tail, so what it found ends where its eviction cut).  The
view was right; the KV cache is too small for what waits on it, and a thrashing
cache does this to most requests (ShareGPT conversations on 8k-token caches, in
the simulator: 405 of 967 requests found less than expected, and 11 of 12
replicas read ``mismatch`` with advice about hash seeds; with this check all 405
are ``evicted`` and those 11 replicas ``evicting``).  Such a request is counted as
``evicted``, not as a miss, and an evicted share above ``threshold`` puts the
replica in the ``evicting`` state, with advice about the cache instead of the
view.  A wrong view comes first: ``mismatch`` wins where both shares pass.

vLLM never reports the last prompt token as cached (one token must be computed
to sample from), so a prompt cached in full reports up to one block less than
its blocks; the expectation applies the same cap.  Only replicas with an event
stream are checked: without one the map knows nothing to compare.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from core.kv_stream_health import STATE_ADVICE, StreamState


class ViewState(StrEnum):
    WARMING = "warming"  # fewer than min_requests checked so far
    OK = "ok"
    MISMATCH = "mismatch"
    EVICTING = "evicting"  # the view is right; the engine evicts before it serves


class Comparison(StrEnum):
    """What one completed request's report said of the view."""

    AGREED = "agreed"  # within ``tolerance_blocks`` of the expectation
    MISSED = "missed"  # the view was wrong when the request was routed
    EVICTED = "evicted"  # found less: the engine removed the first block it lacked since


MISMATCH_ADVICE = (
    "The cached tokens this replica reports do not match what the balancer's cache "
    "map expected, so prefix-aware routing is working from a wrong picture. Check "
    "that the balancer hashes blocks like the engine (hash seed, block size), uses "
    "the model's tokenizer and chat template, and receives the replica's KV events; "
    "start vLLM with --enable-prompt-tokens-details so usage carries cached_tokens."
)
EVICTING_ADVICE = (
    "This replica's engine evicts prefixes routed to it before it serves them: the "
    "cache map was right when each request was sent, and the engine's own eviction "
    "events removed the blocks while the request waited. Its KV cache is too small "
    "for the requests queued on it. Give it more KV cache (GPU memory, a smaller "
    "max_num_seqs), send it fewer requests, or, with the meridian policy, start vLLM "
    "with --scheduling-policy priority and set the service's engine_queue to priority "
    "so cached turns start first."
)
ADVICE = {ViewState.MISMATCH: MISMATCH_ADVICE, ViewState.EVICTING: EVICTING_ADVICE}


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


def expected_cached_tokens(blocks: int, block_size: int, prompt_tokens: int) -> int:
    """Tokens an engine should report cached for ``blocks`` held blocks of a prompt."""
    computable = max(prompt_tokens - 1, 0) // block_size * block_size
    return min(blocks * block_size, computable)


@dataclass
class ReplicaCheck:
    """One replica's window of recent comparisons and its lifetime totals."""

    window: deque[Comparison]
    state: ViewState = ViewState.WARMING
    expected_tokens: int = 0
    reported_tokens: int = 0
    checked: int = 0

    @property
    def ratio(self) -> float:
        """The window's share of misses: requests the view was wrong about."""
        return self._share(Comparison.MISSED)

    @property
    def evicted_ratio(self) -> float:
        """The window's share of requests whose prefix the engine evicted after routing."""
        return self._share(Comparison.EVICTED)

    def _share(self, kind: Comparison) -> float:
        return self.window.count(kind) / len(self.window) if self.window else 0.0


@dataclass
class MismatchDetector:
    config: MismatchConfig = field(default_factory=MismatchConfig)
    _replicas: dict[str, ReplicaCheck] = field(default_factory=dict)

    def observe(
        self,
        replica: str,
        *,
        expected: int,
        reported: int,
        block_size: int,
        evicted_since: bool = False,
    ) -> tuple[ViewState, ViewState]:
        """Record one completed request; (state before, state after).
        ``evicted_since``: the engine removed the first expected block it did not
        find after the request was routed (``EvictionLog.removed_since``)."""
        check = self._replicas.get(replica)
        if check is None:
            check = self._replicas[replica] = ReplicaCheck(deque(maxlen=self.config.window))
        check.window.append(self._compare(expected, reported, block_size, evicted_since))
        check.expected_tokens += expected
        check.reported_tokens += reported
        check.checked += 1
        before, check.state = check.state, self._state(check)
        return before, check.state

    def _compare(
        self, expected: int, reported: int, block_size: int, evicted_since: bool
    ) -> Comparison:
        tolerance = self.config.tolerance_blocks * block_size
        if abs(expected - reported) <= tolerance:
            return Comparison.AGREED
        if reported < expected and evicted_since:
            return Comparison.EVICTED
        return Comparison.MISSED

    def _state(self, check: ReplicaCheck) -> ViewState:
        if len(check.window) < self.config.min_requests:
            return ViewState.WARMING
        if check.ratio > self.config.threshold:
            return ViewState.MISMATCH
        if check.evicted_ratio > self.config.threshold:
            return ViewState.EVICTING
        return ViewState.OK

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
    KV-event ``stream`` state when not OK, and the mismatch ``view``'s advice (a wrong
    view, or a cache that evicts before it serves).  One
    definition for ``/internal/state`` and the live feed the console reads."""
    warnings = []
    if stream is not None and stream is not StreamState.OK:
        warnings.append({"kind": f"kv_stream_{stream}", "message": STATE_ADVICE[stream]})
    if view is not None and view.get("advice"):
        kind = (
            "cache_evicting" if view.get("state") == ViewState.EVICTING else "cache_view_mismatch"
        )
        warnings.append({"kind": kind, "message": str(view["advice"])})
    return warnings
