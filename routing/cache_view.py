"""The hit-rate mismatch detector's glue: expect at dispatch, compare at completion.

``expect`` runs when a request is placed on a replica, before the replica has
done anything with it: the confirmed blocks the cache map holds for that
replica, times the block size (``core.cache_view_check``), and the count of that
replica's removals so far (``core.eviction_log``).  Computed at completion
instead, it would count the blocks this very request stored.  ``observe`` runs
when the request finished with usage, asks the map whether the engine removed
the first expected block it did not find since, and feeds the detector; a change
of state is logged once.  Replicas without a KV-event stream, and models not routed by
``cache_map``, get no expectation and are not checked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from core.cache_view_check import (
    ADVICE,
    MismatchConfig,
    MismatchDetector,
    ViewState,
    confirmed_prefix_blocks,
    expected_cached_tokens,
)
from core.types import RequestDescriptor
from routing.kv_events import KVEventConsumer
from routing.telemetry import BalancerMetrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the cache map expected of a request when it was routed: the cached
    tokens, the blocks they are, and the replica's removal count then."""

    tokens: int
    blocks: tuple[int, ...]
    mark: int


class CacheViewMonitor:
    def __init__(
        self, kv: KVEventConsumer, metrics: BalancerMetrics, config: MismatchConfig | None = None
    ) -> None:
        self.kv = kv
        self.metrics = metrics
        self.detector = MismatchDetector(config or MismatchConfig())

    def block_size(self, model: str) -> int:
        """The block size the balancer's keys are made with: the model's scheme's
        (its engine's, from ``vllm:cache_config_info``)."""
        return self.kv.schemes.scheme(model).block_size

    def expect(self, replica: str, request: RequestDescriptor) -> Expectation | None:
        """What routing expects ``replica`` to report cached, or None (unchecked)."""
        if replica not in self.kv.streams:
            return None
        policy = self.kv.cache_map_policy(request.model)
        if policy is None:
            return None
        cache_map = policy.cache_map
        blocks = confirmed_prefix_blocks(cache_map, replica, request.block_hashes)
        size = self.block_size(request.model)
        tokens = expected_cached_tokens(blocks, size, request.prompt_tokens)
        held = tuple(request.block_hashes[:blocks])
        return Expectation(tokens, held, cache_map.evictions.mark(replica))

    def observe(
        self, replica: str, model: str, expected: Expectation | None, reported: int
    ) -> None:
        if expected is None:
            return
        self.metrics.cache_expected.inc(replica, amount=expected.tokens)
        self.metrics.cache_reported.inc(replica, amount=reported)
        size = self.block_size(model)
        before, after = self.detector.observe(
            replica,
            expected=expected.tokens,
            reported=reported,
            block_size=size,
            evicted_since=self._evicted_since(replica, model, expected, reported // size),
        )
        if after is before:
            return
        check = self.detector.check(replica)
        if after in ADVICE and check is not None:
            ratio = check.ratio if after is ViewState.MISMATCH else check.evicted_ratio
            logger.warning(
                "cache view of %s: %s (%.0f%% of recent requests). %s",
                replica,
                after,
                ratio * 100,
                ADVICE[after],
            )
        elif before in ADVICE:
            logger.info("cache view of %s: matches the engine again", replica)

    def _evicted_since(
        self, replica: str, model: str, expected: Expectation, found_blocks: int
    ) -> bool:
        """Whether the engine removed the first expected block it did not find after
        the request was routed: what it found ends where its own eviction cut the
        prefix (an engine evicts a freed prefix from its tail), not where the view
        went wrong.  A report of nothing from an engine that keeps the prefix's head
        (usage without ``cached_tokens``) stays a miss."""
        policy = self.kv.cache_map_policy(model)
        missing = expected.blocks[found_blocks : found_blocks + 1]
        if policy is None or not missing:
            return False
        return policy.cache_map.evictions.removed_since(replica, missing, expected.mark)

    def retain(self, replicas: list[str]) -> None:
        self.detector.retain(replicas)

    def view(self, replica: str) -> dict[str, Any] | None:
        check = self.detector.check(replica)
        if check is None:
            return None
        return {
            "state": str(check.state),
            "mismatch_ratio": round(check.ratio, 4),
            "evicted_ratio": round(check.evicted_ratio, 4),
            "checked_requests": check.checked,
            "expected_cached_tokens": check.expected_tokens,
            "reported_cached_tokens": check.reported_tokens,
            "advice": ADVICE.get(check.state, ""),
        }
