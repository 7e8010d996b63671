"""The console's live feed: each balancer's per-second deltas, and their aggregation.

Each balancer appends one ``LiveRecord`` a second to its region's Redis stream (a
bounded ``XADD``): what grew since its previous record (requests, errors, tokens,
forwards, TTFT histogram counts) and its gauges now (in-flight, queue, waiting, and
a compact row per replica).  The console reads the streams and turns records into
per-region numbers (``region_numbers``) and 15-minute chart series (``series``), so
no process polls a balancer and nothing depends on a Celery deadline.

Rates come from the deltas the balancer measured itself over its own interval, so a
late or skipped record under load lowers nothing: the next one carries the growth.
A restarted balancer (counters fell) counts from zero.  Hit rate is cached prompt
tokens / prompt tokens, the quantity SkyLB §2.2 argues a prefix-aware router should
maximise.  TTFT percentiles are read from summed histogram buckets (the bucket's
upper bound, interpolated linearly inside it), as Prometheus' ``histogram_quantile``.

Pure: no I/O, no clock; callers pass ``now``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

STREAM_PREFIX = "meridian:live:region:"
FIELD = "d"  # the one stream field: the record as JSON
# Over how many seconds the headline rates are taken: long enough that one late
# record under load does not make the number jump, short enough to read as "now".
RATE_WINDOW_S = 5.0

COUNTER_NAMES = (
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "forwarded_in",
    "forwarded_out",
)


def stream_key(region: str) -> str:
    return STREAM_PREFIX + region


@dataclass(frozen=True, slots=True)
class Counters:
    """A balancer's cumulative counters at one moment (since the process started)."""

    requests: float = 0.0
    errors: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    completion_tokens: float = 0.0
    forwarded_in: float = 0.0
    forwarded_out: float = 0.0
    ttft_counts: tuple[int, ...] = ()  # non-cumulative, one per bucket, +Inf last


def counters_delta(now: Counters, before: Counters | None) -> Counters:
    """Growth from ``before`` to ``now``; everything of ``now`` when counters fell."""
    if before is None:
        return now
    restarted = any(getattr(now, n) < getattr(before, n) for n in COUNTER_NAMES) or (
        len(now.ttft_counts) != len(before.ttft_counts)
        or any(a < b for a, b in zip(now.ttft_counts, before.ttft_counts, strict=True))
    )
    if restarted:
        return now
    grown = {n: getattr(now, n) - getattr(before, n) for n in COUNTER_NAMES}
    ttft = tuple(a - b for a, b in zip(now.ttft_counts, before.ttft_counts, strict=True))
    return Counters(**grown, ttft_counts=ttft)


@dataclass(frozen=True, slots=True)
class ReplicaLive:
    """One replica as its balancer sees it now (what the replicas page shows)."""

    name: str
    healthy: bool
    running: int
    waiting: int
    outstanding: int
    kv_usage: float | None
    hit_rate: float | None
    anticipated_peak: int | None = None
    lookahead: tuple[int, ...] = ()
    warnings: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LiveRecord:
    """One balancer's second: deltas over ``seconds`` ending at ``ts``, gauges at ``ts``."""

    balancer: str
    region: str
    ts: float
    seconds: float
    delta: Counters
    inflight: int = 0
    forwarded_inflight: int = 0
    queue: int = 0
    oldest_wait_s: float = 0.0
    waiting: int = 0
    ttft_buckets: tuple[float, ...] = ()
    replicas: tuple[ReplicaLive, ...] = field(default=())
    # Which of the balancer's processes wrote it ("" for a balancer of one process;
    # docs/scale-out.md), and whether that process routes on its local view only.
    process: str = ""
    shared_degraded: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> LiveRecord:
        """Raises ``ValueError`` (``KeyError``/``TypeError`` folded in) on a bad record."""
        try:
            data = json.loads(raw)
            delta = data.pop("delta")
            delta["ttft_counts"] = tuple(int(c) for c in delta.get("ttft_counts", ()))
            replicas = tuple(
                ReplicaLive(
                    **{
                        **r,
                        "lookahead": tuple(r.get("lookahead", ())),
                        "warnings": tuple(r.get("warnings", ())),
                    }
                )
                for r in data.pop("replicas", ())
            )
            buckets = tuple(float(b) for b in data.pop("ttft_buckets", ()))
            return cls(**data, delta=Counters(**delta), ttft_buckets=buckets, replicas=replicas)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed live record: {exc}") from exc


def quantile(q: float, buckets: Sequence[float], counts: Sequence[int]) -> float | None:
    """The q-quantile of a histogram (non-cumulative counts, +Inf last); None if empty.

    Inside a bucket the value is interpolated linearly; in the +Inf bucket it is the
    highest finite bound (the histogram cannot say more)."""
    total = sum(counts)
    if total <= 0 or not buckets or len(counts) != len(buckets) + 1:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index == len(buckets):
                return buckets[-1]
            lower = buckets[index - 1] if index else 0.0
            share = (rank - seen) / count
            return round(lower + (buckets[index] - lower) * share, 4)
        seen += count
    return buckets[-1]


def _sum_counts(records: Iterable[LiveRecord]) -> tuple[tuple[float, ...], list[int]]:
    buckets: tuple[float, ...] = ()
    counts: list[int] = []
    for record in records:
        if not record.delta.ttft_counts:
            continue
        if not counts or record.ttft_buckets != buckets:
            if counts and record.ttft_buckets != buckets:
                continue  # a balancer with other buckets: not mixed into one histogram
            buckets = record.ttft_buckets
            counts = [0] * len(record.delta.ttft_counts)
        counts = [a + b for a, b in zip(counts, record.delta.ttft_counts, strict=True)]
    return buckets, counts


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den > 0 else None


def _rate(records: Sequence[LiveRecord], name: str) -> float:
    """Sum over balancers of each one's growth / the seconds its records cover."""
    total = 0.0
    for group in _by_balancer(records).values():
        seconds = sum(r.seconds for r in group)
        if seconds > 0:
            total += sum(getattr(r.delta, name) for r in group) / seconds
    return total


def _by_balancer(records: Iterable[LiveRecord]) -> dict[tuple[str, str], list[LiveRecord]]:
    """Records by writer: each process of a balancer measures its own intervals and
    counters, so its rates and gauges are its own (and the region's are their sum)."""
    groups: dict[tuple[str, str], list[LiveRecord]] = {}
    for record in records:
        groups.setdefault((record.balancer, record.process), []).append(record)
    return groups


@dataclass(frozen=True, slots=True)
class RegionNumbers:
    """A region's live numbers: rates over the window, gauges from each balancer's latest."""

    rps: float | None
    hit_rate: float | None
    completion_tps: float | None
    errors_per_s: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    forwarded_in: int
    forwarded_out: int
    local_share: float | None
    inflight: int
    forwarded_inflight: int
    queue: int
    oldest_wait_s: float
    waiting: int
    last_ts: float | None  # newest record of the region: "no data since" when old
    # Balancer processes heard in the window, and those routing on their local view
    # only because Redis is slow or down (docs/scale-out.md).
    processes: int = 0
    degraded: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def quiet(last_ts: float | None) -> RegionNumbers:
    """A region with no record in the window: no rates (not zeros), nothing in flight."""
    return RegionNumbers(
        rps=None,
        hit_rate=None,
        completion_tps=None,
        errors_per_s=None,
        ttft_p50_s=None,
        ttft_p90_s=None,
        forwarded_in=0,
        forwarded_out=0,
        local_share=None,
        inflight=0,
        forwarded_inflight=0,
        queue=0,
        oldest_wait_s=0.0,
        waiting=0,
        last_ts=last_ts,
    )


def region_numbers(
    records: Sequence[LiveRecord], now: float, *, window_s: float = RATE_WINDOW_S
) -> RegionNumbers:
    """One region's numbers from its records (any order, any age).

    Rates use the records of the last ``window_s`` seconds; with none there (the
    region went quiet) every number is None and ``last_ts`` says since when."""
    recent = [r for r in records if now - window_s < r.ts <= now + window_s]
    latest = [max(group, key=lambda r: r.ts) for group in _by_balancer(recent).values()]
    last_ts = max((r.ts for r in records), default=None)
    if not recent:
        return quiet(last_ts)
    buckets, counts = _sum_counts(recent)
    requests = sum(r.delta.requests for r in recent)
    out = sum(r.delta.forwarded_out for r in recent)
    return RegionNumbers(
        rps=round(_rate(recent, "requests"), 2),
        hit_rate=_ratio(
            sum(r.delta.cached_tokens for r in recent), sum(r.delta.prompt_tokens for r in recent)
        ),
        completion_tps=round(_rate(recent, "completion_tokens"), 1),
        errors_per_s=round(_rate(recent, "errors"), 2),
        ttft_p50_s=quantile(0.5, buckets, counts),
        ttft_p90_s=quantile(0.9, buckets, counts),
        forwarded_in=int(sum(r.delta.forwarded_in for r in recent)),
        forwarded_out=int(out),
        # Requests this region served itself rather than pushing to a peer (SkyLB §3.3).
        local_share=_ratio(max(requests - out, 0.0), requests),
        inflight=sum(r.inflight for r in latest),
        forwarded_inflight=sum(r.forwarded_inflight for r in latest),
        queue=sum(r.queue for r in latest),
        oldest_wait_s=round(max((r.oldest_wait_s for r in latest), default=0.0), 3),
        waiting=sum(r.waiting for r in latest),
        last_ts=last_ts,
        processes=len(latest),
        degraded=sum(1 for r in latest if r.shared_degraded),
    )


def latest_replicas(records: Iterable[LiveRecord]) -> dict[str, tuple[str, float, ReplicaLive]]:
    """Replica name -> (balancer, ts, row) from the newest record that reports it."""
    seen: dict[str, tuple[str, float, ReplicaLive]] = {}
    for record in records:
        for row in record.replicas:
            known = seen.get(row.name)
            if known is None or known[1] < record.ts:
                seen[row.name] = (record.balancer, record.ts, row)
    return seen


def last_seen(records: Iterable[LiveRecord]) -> dict[str, float]:
    """Balancer name -> the ts of its newest record."""
    seen: dict[str, float] = {}
    for record in records:
        seen[record.balancer] = max(seen.get(record.balancer, -math.inf), record.ts)
    return seen


def series(records: Sequence[LiveRecord], *, step_s: float = 5.0) -> dict[str, list[float | None]]:
    """One region's chart series: a point per ``step_s`` that had records.

    Keys ``t`` (epoch s, the step's end), ``rps``, ``hit_rate``, ``queue`` (balancer
    queue + replicas' waiting) and ``ttft`` (p50).  Steps without records are left
    out, so a quiet period shows as a gap rather than as zeros."""
    steps: dict[int, list[LiveRecord]] = {}
    for record in records:
        steps.setdefault(math.floor(record.ts / step_s), []).append(record)
    out: dict[str, list[float | None]] = {k: [] for k in ("t", "rps", "hit_rate", "queue", "ttft")}
    for index in sorted(steps):
        group = steps[index]
        end = (index + 1) * step_s
        numbers = region_numbers(group, end, window_s=step_s)
        out["t"].append(end)
        out["rps"].append(numbers.rps)
        out["hit_rate"].append(numbers.hit_rate)
        out["queue"].append(float(numbers.queue + numbers.waiting))
        out["ttft"].append(numbers.ttft_p50_s)
    return out


def decode_all(raws: Iterable[str | bytes]) -> list[LiveRecord]:
    """The records that decode; a malformed one is skipped (a stream is shared)."""
    records = []
    for raw in raws:
        try:
            records.append(LiveRecord.from_json(raw))
        except ValueError:
            continue
    return records


def replica_row(
    name: str, live: Mapping[str, tuple[str, float, ReplicaLive]]
) -> dict[str, Any] | None:
    """The replica's latest live row as a plain dict, with who reported it and when."""
    found = live.get(name)
    if found is None:
        return None
    balancer, ts, row = found
    return {**asdict(row), "reported_by": balancer, "reported_at": ts}
