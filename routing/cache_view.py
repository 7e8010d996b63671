"""The hit-rate mismatch detector's glue: expect at dispatch, compare at completion.

``expect`` runs when a request is placed on a replica, before the replica has
done anything with it: the confirmed blocks the cache map holds for that
replica, times the block size (``core.cache_view_check``).  Computed at
completion instead, it would count the blocks this very request stored.
``observe`` runs when the request finished with usage, and feeds the detector;
a change of state is logged once.  Replicas without a KV-event stream, and
models not routed by ``cache_map``, get no expectation and are not checked.
"""

from __future__ import annotations

import logging
from typing import Any

from core.cache_view_check import (
    MISMATCH_ADVICE,
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

    def expect(self, replica: str, request: RequestDescriptor) -> int | None:
        """Cached prompt tokens routing expects ``replica`` to report, or None (unchecked)."""
        if replica not in self.kv.streams:
            return None
        policy = self.kv.cache_map_policy(request.model)
        if policy is None:
            return None
        blocks = confirmed_prefix_blocks(policy.cache_map, replica, request.block_hashes)
        size = self.block_size(request.model)
        return expected_cached_tokens(blocks, size, request.prompt_tokens)

    def observe(self, replica: str, model: str, expected: int | None, reported: int) -> None:
        if expected is None:
            return
        self.metrics.cache_expected.inc(replica, amount=expected)
        self.metrics.cache_reported.inc(replica, amount=reported)
        before, after = self.detector.observe(
            replica, expected=expected, reported=reported, block_size=self.block_size(model)
        )
        if after is ViewState.MISMATCH and before is not ViewState.MISMATCH:
            check = self.detector.check(replica)
            ratio = check.ratio if check is not None else 0.0
            logger.warning(
                "cache view of %s: mismatch (%.0f%% of recent requests off by more than "
                "a block). %s",
                replica,
                ratio * 100,
                MISMATCH_ADVICE,
            )
        elif before is ViewState.MISMATCH and after is not ViewState.MISMATCH:
            logger.info("cache view of %s: matches the engine again", replica)

    def retain(self, replicas: list[str]) -> None:
        self.detector.retain(replicas)

    def view(self, replica: str) -> dict[str, Any] | None:
        check = self.detector.check(replica)
        if check is None:
            return None
        return {
            "state": str(check.state),
            "mismatch_ratio": round(check.ratio, 4),
            "checked_requests": check.checked,
            "expected_cached_tokens": check.expected_tokens,
            "reported_cached_tokens": check.reported_tokens,
            "advice": MISMATCH_ADVICE if check.state is ViewState.MISMATCH else "",
        }
