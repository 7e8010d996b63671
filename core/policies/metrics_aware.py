"""Metrics-aware picking: LoRA affinity, queue length and KV usage from the latest probe.

Higress's GPU-aware balancing (001) follows the Kubernetes Gateway API
Inference Extension's pod picker: a chain of filters over engine metrics, each
narrowing the candidate set, then the least loaded of what is left:

1. **Queue** — keep targets whose waiting queue (``vllm:num_requests_waiting``)
   is at most ``queue_threshold`` (the extension's ``queueThresholdCritical``,
   5): a queued request means a full batch, the same signal as SkyLB's SP-P.
2. **LoRA affinity** — for a request naming an adapter, keep targets in the
   best tier of ``core.lora`` (adapter active, else room to load it),
   so it is not swapped in (an adapter load costs a prefill's worth of latency
   and evicts another adapter).  The router already narrows every policy's
   candidates this way; here the order matters: a full queue outranks affinity.
3. **KV** — keep targets whose KV-cache usage (``vllm:kv_cache_usage_perc``)
   is at most ``kv_usage_threshold`` (0.8), which still have room to admit.

A filter that would leave nothing is *relaxed* (skipped), as the extension
falls back from its low-latency path when no pod passes: a busy fleet still
routes, it just loses that preference.  The survivors are ranked by the
shared least-loaded order (outstanding, waiting, running, id).  The policy is
stateless; the probe data is at most one probe interval old, which is why the
exact outstanding count decides among survivors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.lora import ACTIVE, ROOM, adapter_tier
from core.policy import PolicyBase, least_loaded
from core.types import RequestDescriptor, TargetState


@dataclass(frozen=True, slots=True)
class MetricsAwareConfig:
    queue_threshold: int = 5
    kv_usage_threshold: float = 0.8

    def __post_init__(self) -> None:
        if self.queue_threshold < 0 or not 0.0 <= self.kv_usage_threshold <= 1.0:
            raise ValueError("queue_threshold must be >= 0, kv_usage_threshold in [0, 1]")


Filter = Callable[[TargetState], bool]


def relaxed_filter(candidates: list[TargetState], keep: Filter) -> list[TargetState]:
    """``candidates`` passing ``keep``, or all of them when none would."""
    passed = [t for t in candidates if keep(t)]
    return passed or candidates


class MetricsAwarePolicy(PolicyBase):
    name = "metrics_aware"

    def __init__(self, config: MetricsAwareConfig | None = None) -> None:
        self.config = config or MetricsAwareConfig()

    def filters(self, request: RequestDescriptor) -> list[Filter]:
        cfg = self.config
        chain: list[Filter] = [lambda t: t.waiting <= cfg.queue_threshold]
        adapter = request.lora
        if adapter:
            chain.append(lambda t: adapter_tier(t, adapter) == ACTIVE)
            chain.append(lambda t: adapter_tier(t, adapter) <= ROOM)
        chain.append(lambda t: t.kv_usage <= cfg.kv_usage_threshold)
        return chain

    def select(
        self, request: RequestDescriptor, candidates: Sequence[TargetState]
    ) -> TargetState | None:
        pool = list(candidates)
        for keep in self.filters(request):
            pool = relaxed_filter(pool, keep)
        return least_loaded(pool)
