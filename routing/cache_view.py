"""The hit-rate mismatch detector's glue: expect at dispatch, compare at completion.

``expect`` runs when a request is placed on a replica, before the replica has
done anything with it: the confirmed blocks the cache map holds for that
replica, times the block size (``core.cache_view_check``), and the count of that
replica's removals so far (``core.eviction_log``).  Computed at completion
instead, it would count the blocks this very request stored.  ``observe`` runs
when the request finished with usage, asks the map whether the engine removed
the first expected block it did not find since, and feeds the detector; a change
of state is logged once.  A request that found less and whose removal is not in
the map yet is judged after the next event batch but one (``after_batch``): an
engine that evicts a prefix just before it schedules the request publishes the
removals just before the answer, and the consumer reads them on the same event
loop and applies them in batches.  The map is the ``cache_map`` policy's own, or,
for a policy that takes events into holdings of its own (``meridian`` with
``tree_from_kv_events``), the map of confirmed blocks the consumer keeps beside them
(``core.view_sink``).  Replicas without a KV-event stream, and models whose policy
takes no events, get no expectation and are not checked.
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


@dataclass(frozen=True, slots=True)
class Report:
    """A completed request's comparison, judged at once or after the next batches."""

    replica: str
    model: str
    expected: Expectation
    reported: int


class CacheViewMonitor:
    def __init__(
        self, kv: KVEventConsumer, metrics: BalancerMetrics, config: MismatchConfig | None = None
    ) -> None:
        self.kv = kv
        self.metrics = metrics
        self.detector = MismatchDetector(config or MismatchConfig())
        # Short reports no eviction explained yet: arriving since the last batch, and
        # held through one whole batch interval (judged after the next).
        self._arriving: list[Report] = []
        self._held: list[Report] = []

    def block_size(self, model: str) -> int:
        """The block size the balancer's keys are made with: the model's scheme's
        (its engine's, from ``vllm:cache_config_info``)."""
        return self.kv.schemes.scheme(model).block_size

    def expect(self, replica: str, request: RequestDescriptor) -> Expectation | None:
        """What routing expects ``replica`` to report cached, or None (unchecked)."""
        if replica not in self.kv.streams:
            return None
        cache_map = self.kv.view_map(request.model)
        if cache_map is None:
            return None
        blocks = cache_map.confirmed_prefix(replica, request.block_hashes)
        size = self.block_size(request.model)
        tokens = expected_cached_tokens(blocks, size, request.prompt_tokens)
        held = tuple(request.block_hashes[:blocks])
        return Expectation(tokens, held, cache_map.evictions.mark(replica))

    def observe(
        self, replica: str, model: str, expected: Expectation | None, reported: int
    ) -> None:
        """Judge one completed request, or hold it for the event batches to come: an
        engine that evicted the prefix just before it scheduled the request published
        the removals just before the answer, and the consumer may not have read them
        yet (it reads on the same event loop, and applies in batches)."""
        if expected is None:
            return
        self.metrics.cache_expected.inc(replica, amount=expected.tokens)
        self.metrics.cache_reported.inc(replica, amount=reported)
        report = Report(replica, model, expected, reported)
        short = self._short(report)
        evicted = short and self._evicted_since(report)
        if short and not evicted:
            self._arriving.append(report)
        else:
            self._judge(report, evicted)

    def after_batch(self) -> None:
        """The KV-event consumer applied a batch: judge the reports held back since
        before the previous batch (a whole batch interval of events read since each),
        now with what those events removed."""
        ripe, self._held, self._arriving = self._held, self._arriving, []
        for report in ripe:
            self._judge(report, self._evicted_since(report))  # short, by how it was held

    def _short(self, report: Report) -> bool:
        """The engine found more than a tolerance less than the map expected."""
        size = self.block_size(report.model)
        tolerance = self.detector.config.tolerance_blocks * size
        return report.expected.tokens - report.reported > tolerance

    def _judge(self, report: Report, evicted_since: bool) -> None:
        replica = report.replica
        before, after = self.detector.observe(
            replica,
            expected=report.expected.tokens,
            reported=report.reported,
            block_size=self.block_size(report.model),
            evicted_since=evicted_since,
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

    def _evicted_since(self, report: Report) -> bool:
        """Whether the engine removed the first expected block it did not find after
        the request was routed: what it found ends where its own eviction cut the
        prefix (an engine evicts a freed prefix from its tail), not where the view
        went wrong.  A report of nothing from an engine that keeps the prefix's head
        (usage without ``cached_tokens``) stays a miss."""
        cache_map = self.kv.view_map(report.model)
        found = report.reported // self.block_size(report.model)
        missing = report.expected.blocks[found : found + 1]
        if cache_map is None or not missing:
            return False
        # Applied in batches: what was read since the last one may hold the removal.
        self.kv.flush(report.replica)
        return cache_map.evictions.removed_since(report.replica, missing, report.expected.mark)

    def retain(self, replicas: list[str]) -> None:
        self.detector.retain(replicas)
        kept = set(replicas)
        self._arriving = [r for r in self._arriving if r.replica in kept]
        self._held = [r for r in self._held if r.replica in kept]

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
