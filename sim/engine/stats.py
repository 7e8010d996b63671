"""Counters and histograms an engine keeps, named after vLLM's Prometheus metrics.

Token counts follow vLLM's conventions: a prefix-cache *query* is every token
of a request looked up when it is first scheduled and a *hit* is every token
found cached (``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``);
``prompt_tokens`` counts a request's whole prompt once, when its prefill
completes; ``generation_tokens`` counts every sampled token.  Latencies are in
the engine's modeled seconds.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class Histogram:
    """A Prometheus histogram: per-bucket counts (non-cumulative here), sum and count."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs, ending with ``+Inf``, as exposition needs."""
        total = 0
        out: list[tuple[str, int]] = []
        for bound, count in zip((*map(repr, self.buckets), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


@dataclass
class TokenWaits:
    """What the sampled tokens waited for, by the step model's terms
    (``StepTimeProfile.step_terms``): every token sampled in a step waited that whole
    step, so each term is summed once per token.  Divided by ``tokens``, they are the
    mean inter-token latency split into the fixed weight read, prefill and batch.
    ``batch_tokens`` sums each token's own batch (the requests its step scheduled),
    so ``token_batch`` is the batch the average token waited in."""

    tokens: int = 0
    fixed_s: float = 0.0
    prefill_s: float = 0.0
    batch_s: float = 0.0
    batch_tokens: int = 0

    def add_step(
        self, terms: tuple[float, float, float], batch: int, tokens: int, scale: float = 1.0
    ) -> None:
        """One step of ``batch`` scheduled requests that sampled ``tokens``; ``terms``
        is its ``step_terms``, and ``scale`` what its duration was scaled by (the
        engine's slowdown)."""
        fixed, prefill, grows = terms
        self.tokens += tokens
        self.fixed_s += tokens * fixed * scale
        self.prefill_s += tokens * prefill * scale
        self.batch_s += tokens * grows * scale
        self.batch_tokens += tokens * batch

    def merge(self, other: TokenWaits) -> None:
        """Add ``other``'s sums (another replica's): the fleet's waits."""
        self.tokens += other.tokens
        self.fixed_s += other.fixed_s
        self.prefill_s += other.prefill_s
        self.batch_s += other.batch_s
        self.batch_tokens += other.batch_tokens

    def token_batch(self) -> float:
        """The batch the average sampled token waited in."""
        return self.batch_tokens / self.tokens if self.tokens else 0.0


@dataclass
class EngineStats:
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_seconds: float = 0.0
    waits: TokenWaits = field(default_factory=TokenWaits)
    finished: Counter[str] = field(default_factory=Counter)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
