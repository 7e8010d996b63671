"""What a run measured, in SkyLB §5's terms.

* throughput: successful requests per virtual second while the load ran (the
  paper's "service throughput"), plus output tokens/s.  A run bounded by
  ``duration_s`` counts the answers that arrived from the first send to the
  moment clients stopped, over that window: after it the load drains, and how
  long the drain lasts is set by the slowest few requests sent last, not by the
  policy's rate (a closed loop that served more requests ends on more
  stragglers).  A run bounded by a request count counts every answer, from the
  first send to the last answer.  ``throughput_makespan_rps`` is every answer
  over the whole run, drain included, for comparison;
* TTFT and end-to-end latency p50/p90/p99 as the client saw them (including
  the RTT to its balancer and any forward);
* KV hit rate: cached prompt tokens over prompt tokens, from the replicas'
  ``usage.prompt_tokens_details.cached_tokens`` (vLLM's definition);
* outstanding variance: the variance across replicas of requests held by each
  engine, averaged over samples while clients were sending (§5.1 uses it to
  show load imbalance);
* share forwarded: requests served through a peer balancer;
* queue waits: time spent in balancers' regional queues (SP-P holds requests
  there instead of on replicas, §3.3);
* honest headline numbers over *all* issued requests, because percentiles over
  successes flatter a policy that drops: ``rejected`` (400s: the engine refused
  the request, e.g. a context longer than ``max_model_len``), ``dropped``
  (every other failure, a 503 after a queue timeout, or still unfinished when
  the run ended), SLO attainment (the share of issued requests answered with a
  TTFT within ``ttft_slo_s``) and goodput (those requests per second, over the
  throughput's window).  A rejection or a drop is always a miss;
* oracle bounds on the hit rate (``sim.des.oracle``): one infinite cache, and
  the fleet's real capacity pooled as if placement were free, with the policy's
  hit rate as a share of the latter (``hit_of_bound``); and what this
  deployment's balancers can reach without forwarding (each balancer's
  replicas pooled for its own clients' requests), with the hit rate as a share
  of it (``hit_of_reachable``);
* what a token waited for (``token_waits``): the engines' mean inter-token
  latency split by the step model's terms (the fixed weight read, prefill, and
  the part that grows with the batch), the batch the average token waited in,
  and the latency had each instant's running requests been spread evenly over
  the replicas (all of them, or each region's own).  A closed loop's throughput
  follows the inter-token latency, and a router moves only its prefill and batch
  terms: this says how much room a better placement has left.

Every issued request is accounted for: ``ok + failed + unfinished == issued``.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sim.des.clients import RequestRecord
from sim.des.config import DEFAULT_TTFT_SLO_S, SimConfig
from sim.des.oracle import (
    BalancerPool,
    Bounds,
    CacheUse,
    hit_rate_bounds,
    max_hit_blocks,
    share_of_bound,
)
from sim.des.world import SimRun
from sim.engine.stats import TokenWaits

STATUS_REJECTED = 400


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of ``values`` (sorted here); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


@dataclass(frozen=True)
class Summary:
    label: str
    issued: int
    ok: int
    failed: int
    unfinished: int
    errors: dict[str, int]
    makespan_s: float
    # The window rates are over and the answers inside it (see the module docstring).
    window_s: float
    served_in_window: int
    throughput_rps: float
    throughput_makespan_rps: float
    output_tps: float
    ttft: dict[str, float | None]
    e2e: dict[str, float | None]
    prompt_tokens: int
    cached_tokens: int
    hit_rate: float
    outstanding_variance: float
    forwarded_share: float
    queue_wait: dict[str, float | None]
    per_region: dict[str, dict[str, Any]] = field(default_factory=dict)
    rejected: int = 0
    dropped: int = 0
    ttft_slo_s: float = DEFAULT_TTFT_SLO_S
    slo_attainment: float = 0.0
    goodput_rps: float = 0.0
    bound_infinite: float = 0.0
    bound_hit_rate: float = 0.0
    hit_of_bound: float | None = None
    bound_reachable: float = 0.0
    hit_of_reachable: float | None = None
    # The pooled bound with each lookup when an engine took the request (the run's waits).
    bound_at_start: float = 0.0
    hit_of_bound_at_start: float | None = None
    # The mean inter-token latency by the step model's terms (``token_waits``).
    waits: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pcts(values: list[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q / 100) for q in (50, 90, 99)}


def summarize(run: SimRun, label: str = "", ttft_slo_s: float = DEFAULT_TTFT_SLO_S) -> Summary:
    records = run.records
    ok = [r for r in records if r.ok]
    unfinished = [r for r in records if r.done_at is None]
    failed = len(records) - len(ok) - len(unfinished)
    start = min((r.sent_at for r in records), default=0.0)
    makespan = max(run.end_s - start, 1e-9)
    window_end = _load_end(run.config, run.end_s)
    window = max(window_end - start, 1e-9)
    in_window = [r for r in ok if r.done_at is not None and r.done_at <= window_end]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    waits = [r.journey.queue_wait for r in records if r.done_at is not None]
    rejected = sum(1 for r in records if r.done_at is not None and r.status == STATUS_REJECTED)
    good = sum(1 for r in ok if in_slo(r, ttft_slo_s))
    bounds = _bounds(run, prompt)
    hit_rate = cached / prompt if prompt else 0.0
    return Summary(
        label=label or run.config.policy,
        issued=len(records),
        ok=len(ok),
        failed=failed,
        unfinished=len(unfinished),
        errors=dict(Counter(str(r.status) for r in records if r.done_at is not None and not r.ok)),
        makespan_s=makespan,
        window_s=window,
        served_in_window=len(in_window),
        throughput_rps=len(in_window) / window,
        throughput_makespan_rps=len(ok) / makespan,
        output_tps=sum(r.completion_tokens for r in in_window) / window,
        ttft=_pcts([r.ttft for r in ok if r.ttft is not None]),
        e2e=_pcts([r.e2e for r in ok if r.e2e is not None]),
        prompt_tokens=prompt,
        cached_tokens=cached,
        hit_rate=hit_rate,
        outstanding_variance=_variance(run),
        forwarded_share=sum(r.journey.forwarded for r in ok) / len(ok) if ok else 0.0,
        queue_wait={**_pcts(waits), "mean": statistics.fmean(waits) if waits else None},
        per_region=_per_region(run),
        rejected=rejected,
        dropped=len(records) - len(ok) - rejected,
        ttft_slo_s=ttft_slo_s,
        slo_attainment=good / len(records) if records else 0.0,
        goodput_rps=sum(1 for r in in_window if in_slo(r, ttft_slo_s)) / window,
        bound_infinite=bounds.infinite,
        bound_hit_rate=bounds.pooled,
        hit_of_bound=share_of_bound(hit_rate, bounds.pooled),
        bound_reachable=bounds.reachable,
        hit_of_reachable=share_of_bound(hit_rate, bounds.reachable),
        bound_at_start=bounds.pooled_at_start,
        hit_of_bound_at_start=share_of_bound(hit_rate, bounds.pooled_at_start),
        waits=token_waits(run.waits, _while_sending(run, run.batches), run.replica_regions),
    )


def token_waits(
    waits: TokenWaits, batches: Sequence[tuple[int, ...]], regions: Sequence[str] = ()
) -> dict[str, float]:
    """The mean inter-token latency (ms) by term, and had the batches been even.

    ``batches`` are the replicas' running batches sampled at the same instants, and
    ``regions`` each replica's region.  ``even_share`` is how much smaller the batch
    the average running request sat in would have been, had each instant's requests
    been spread evenly over all the replicas (``even_share``); ``region_share``, over
    each region's own replicas (what balancers that never forward could do).  Both
    leave out how the fleet's total moved over time (a closed loop's programs widen
    and narrow together), which no placement changes.  The batch term grows in
    proportion to the batch, so ``even_itl_ms`` and ``region_itl_ms`` price it at
    those shares of itself."""
    if not waits.tokens:
        return {}
    per_token_ms = 1000.0 / waits.tokens
    fixed = waits.fixed_s * per_token_ms
    prefill = waits.prefill_s * per_token_ms
    batch = waits.batch_s * per_token_ms
    share = even_share(batches)
    in_region = even_share(batches, _groups(regions))
    return {
        "itl_ms": fixed + prefill + batch,
        "fixed_ms": fixed,
        "prefill_ms": prefill,
        "batch_ms": batch,
        "token_batch": waits.token_batch(),
        "even_share": share,
        "even_itl_ms": fixed + prefill + batch * share,
        "region_share": in_region,
        "region_itl_ms": fixed + prefill + batch * in_region,
    }


def even_share(batches: Sequence[tuple[int, ...]], groups: Sequence[Sequence[int]] = ()) -> float:
    """The batch a running request sat in had every instant's batches been even within
    each group of replica indices (all of them, without ``groups``), as a share of the
    one it sat in: sum(B^2) over sum(mean^2) per replica and instant (1.0: already
    even, or nothing ran)."""
    squares = evened = 0.0
    for sample in batches:
        squares += sum(b * b for b in sample)
        for group in groups or (range(len(sample)),):
            total = sum(sample[i] for i in group)
            evened += total * total / len(group) if group else 0.0
    return evened / squares if squares else 1.0


def _groups(regions: Sequence[str]) -> list[list[int]]:
    """Replica indices by region, in first-seen order."""
    by_region: dict[str, list[int]] = {}
    for index, region in enumerate(regions):
        by_region.setdefault(region, []).append(index)
    return list(by_region.values())


def _load_end(config: SimConfig, run_end_s: float) -> float:
    """When clients stopped sending: the end of the window rates are measured over.

    A run bounded by duration alone stops at a known time; one bounded by a request
    count (or both) is measured to its last answer, as a fixed-count benchmark is.
    """
    if config.duration_s is None or config.max_requests is not None:
        return run_end_s
    return min(config.warmup_s + config.duration_s, run_end_s)


def in_slo(record: RequestRecord, ttft_slo_s: float) -> bool:
    """Answered with its first token within the SLO: what goodput counts."""
    return record.ok and record.ttft is not None and record.ttft <= ttft_slo_s


def _bounds(run: SimRun, prompt_tokens: int) -> Bounds:
    """The oracle bounds over this run's own requests and its fleet's KV capacity."""
    config, engine = run.config, run.config.engine
    served = [r for r in run.records if r.ok]
    uses = [
        CacheUse(
            r.sent_at,
            r.done_at,
            r.prompt_keys,
            r.reply_keys,
            max_hit_blocks(r.prompt_tokens, engine.block_size),
            r.journey.engine_started_at,
        )
        for r in served
    ]
    capacity = engine.num_blocks * sum(config.replicas.values())
    return hit_rate_bounds(
        uses,
        prompt_tokens,
        block_size=engine.block_size,
        capacity_blocks=capacity,
        balancers=_balancer_pools(config, [r.region for r in served], uses),
    )


def _balancer_pools(
    config: SimConfig, regions: Sequence[str], uses: Sequence[CacheUse]
) -> list[BalancerPool]:
    """The reachable bound's split: none for one balancer owning every replica; with a
    balancer per region, each region's clients' requests over its own replicas."""
    if config.effective_deployment == "single":
        return []
    by_region: dict[str, list[CacheUse]] = {region: [] for region in config.regions}
    for region, use in zip(regions, uses, strict=True):
        by_region[region].append(use)
    return [
        BalancerPool(mine, config.engine.num_blocks * config.replicas[region])
        for region, mine in by_region.items()
    ]


def _variance(run: SimRun) -> float:
    """Mean over samples of the across-replica variance of outstanding requests."""
    values = [
        statistics.pvariance(counts)
        for counts in _while_sending(run, run.samples)
        if len(counts) > 1
    ]
    return statistics.fmean(values) if values else 0.0


def _while_sending(
    run: SimRun, samples: Sequence[tuple[float, tuple[int, ...]]]
) -> list[tuple[int, ...]]:
    """The samples taken while clients were sending (not the drain after it)."""
    last_send = max((r.sent_at for r in run.records), default=0.0)
    return [counts for at, counts in samples if at <= last_send]


def _per_region(run: SimRun) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for region in run.config.regions:
        mine = [r for r in run.records if r.region == region and r.ok]
        if not mine:
            continue
        prompt = sum(r.prompt_tokens for r in mine)
        out[region] = {
            "ok": len(mine),
            "ttft_p50": percentile([r.ttft for r in mine if r.ttft is not None], 0.5),
            "hit_rate": sum(r.cached_tokens for r in mine) / prompt if prompt else 0.0,
            "forwarded_share": sum(r.journey.forwarded for r in mine) / len(mine),
        }
    return out
