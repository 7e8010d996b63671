"""What a replay measured: per-request outcomes folded into running totals.

``ReplayStats`` is updated on the event loop (no locks: every update is a plain
synchronous method) and read once a second for the status line, then once for
the summary, through an immutable ``ReplaySnapshot``.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# Latency samples kept for percentiles; the newest win once a long run passes this.
SAMPLE_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one request ended.  ``error_kind`` groups errors for display ("HTTP 503",
    "connection", "timeout"); ``error`` is the server's or the client's message."""

    ok: bool
    latency: float
    reply: str = ""
    ttft: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    status: int | None = None
    error_kind: str = ""
    error: str = ""


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values; ``None`` when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class ReplaySnapshot:
    """The numbers the status line and the summary show."""

    elapsed: float
    sent: int
    ok: int
    failed: int
    cancelled: int
    in_flight: int
    errors: dict[str, int]
    error_messages: dict[str, str]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    latency_p50: float | None
    latency_p90: float | None

    @property
    def requests_per_s(self) -> float:
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated (completion) tokens per second over the whole run."""
        return self.completion_tokens / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def cached_share(self) -> float:
        """Fraction of prompt tokens the server answered from its prefix cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class ReplayStats:
    """Running totals of one replay."""

    clock: Callable[[], float] = time.monotonic
    started_at: float | None = None
    sent: int = 0
    ok: int = 0
    failed: int = 0
    cancelled: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    error_messages: dict[str, str] = field(default_factory=dict)
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLE_LIMIT))
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLE_LIMIT))

    def start(self) -> None:
        self.started_at = self.clock()

    def request_started(self) -> None:
        self.sent += 1
        self.in_flight += 1

    def request_cancelled(self) -> None:
        self.in_flight -= 1
        self.cancelled += 1

    def request_finished(self, outcome: Outcome) -> None:
        self.in_flight -= 1
        if not outcome.ok:
            self.failed += 1
            self.errors[outcome.error_kind] += 1
            # The latest message per kind: enough to tell the user what went wrong.
            self.error_messages[outcome.error_kind] = outcome.error
            return
        self.ok += 1
        self.prompt_tokens += outcome.prompt_tokens
        self.completion_tokens += outcome.completion_tokens
        self.cached_tokens += outcome.cached_tokens
        self.latencies.append(outcome.latency)
        if outcome.ttft is not None:
            self.ttfts.append(outcome.ttft)

    def snapshot(self) -> ReplaySnapshot:
        elapsed = self.clock() - self.started_at if self.started_at is not None else 0.0
        ttfts, latencies = sorted(self.ttfts), sorted(self.latencies)
        return ReplaySnapshot(
            elapsed=elapsed,
            sent=self.sent,
            ok=self.ok,
            failed=self.failed,
            cancelled=self.cancelled,
            in_flight=self.in_flight,
            errors=dict(self.errors.most_common()),
            error_messages=dict(self.error_messages),
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            ttft_p50=percentile(ttfts, 0.5),
            ttft_p90=percentile(ttfts, 0.9),
            ttft_p99=percentile(ttfts, 0.99),
            latency_p50=percentile(latencies, 0.5),
            latency_p90=percentile(latencies, 0.9),
        )
